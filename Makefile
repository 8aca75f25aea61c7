# The two commands of the README: `make demo` and `make test`. Each installs the Debian packages it
# needs when they are missing (apt-get, as root), configures into build/ and builds.
BUILD ?= build
BUILD_TYPE ?= Release
JOBS ?= $(shell nproc 2>/dev/null || echo 2)
CMAKE_FLAGS ?=
BIN := $(BUILD)/bin
MPIEXEC ?= $(shell command -v mpiexec.mpich 2>/dev/null || echo mpiexec)

PACKAGES := cmake g++ make pkg-config mpich libmpich-dev libtrilinos-kokkos-dev libtrilinos-kokkos-kernels-dev doctest-dev \
            libcli11-dev nlohmann-json3-dev libbenchmark-dev libopenblas-dev clang libclang-rt-14-dev

.PHONY: all deps configure build test test-large test-sanitize test-multihost demo bench bench-multihost clean

all: build

deps:
	@missing=""; for p in $(PACKAGES); do \
	  dpkg-query -W -f='$${Status}' $$p 2>/dev/null | grep -q "install ok installed" || missing="$$missing $$p"; \
	done; \
	if [ -n "$$missing" ]; then \
	  echo "make deps: installing$$missing"; \
	  if [ "$$(id -u)" -ne 0 ]; then SUDO=sudo; else SUDO=; fi; \
	  $$SUDO apt-get update -qq && \
	  DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq $$missing >/dev/null || exit 1; \
	fi

configure: deps
	@if [ ! -f $(BUILD)/CMakeCache.txt ]; then \
	  cmake -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=$(BUILD_TYPE) $(CMAKE_FLAGS); fi

build: configure
	cmake --build $(BUILD) -j $(JOBS)

# Every test, the oversubscribed 16/32-rank layouts (label `large`) included.
test: build
	cd $(BUILD) && ctest --output-on-failure -j $(JOBS)

# The tests again in their own tree, built by g++ with AddressSanitizer and UBSan (-Og, line tables:
# under both sanitizers g++ 12 takes about half the CPU time of -O1 to compile a test, and the tests
# run about as fast).
# Any report fails its test: UBSan halts at the first one, ASan (leaks included) always does.
# Left out there, as they add no checked code: the benchmarks, the AVX2 twin of the kernel tests
# (test_kernels_avx2; the native kernels run), the compile-time policy twin (test_policy_twin: its
# checks are done by the compiler), the compile-fail and install tests (they compile,
# without sanitizers), the 16/32-rank layouts (label large) and the 8-rank runs of the MPI tests
# (every MPI test runs at 1, 2 and 4 ranks; tests written for 8 ranks keep them).
# HWLOC_PLUGINS_BLACKLIST: MPI_Init has hwloc load its PCI plugin, whose libpciaccess leaks ~1 KiB
# that LeakSanitizer cannot attribute (the plugin is unloaded before the leak check, so the frames
# are "<unknown module>" and no suppression can name them); CPU-only ranks need no PCI discovery.
# The libFuzzer targets (their own clang build with ASan + UBSan) and the header checks run in build/.
# Stack-use-after-return detection is off on AVX-512 CPUs: g++ 12 then stores zmm registers with
# 64-byte-aligned moves into ASan's fake stack frames, which are 32-byte aligned (a general
# protection fault in the first test body that spills one).
SANITIZE_BUILD ?= build-sanitize
SANITIZE_UAR := $(if $(shell grep -qw avx512f /proc/cpuinfo 2>/dev/null && echo y),0,1)
SANITIZE_FLAGS := -fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=undefined
test-sanitize: deps
	@if [ ! -f $(SANITIZE_BUILD)/CMakeCache.txt ]; then \
	  cmake -S . -B $(SANITIZE_BUILD) -DCMAKE_BUILD_TYPE=Debug -DCMAKE_CXX_COMPILER=g++ \
	    -DCMAKE_CXX_FLAGS="-Og $(SANITIZE_FLAGS)" -DCMAKE_CXX_FLAGS_DEBUG=-g1 \
	    -DCMAKE_EXE_LINKER_FLAGS="$(SANITIZE_FLAGS)" \
	    -DRELAYOUT_HEADER_CHECK=OFF -DRELAYOUT_BUILD_BENCH=OFF -DRELAYOUT_FUZZ=OFF \
	    -DRELAYOUT_TEST_KERNELS_AVX2=OFF -DRELAYOUT_TEST_POLICY_TWIN=OFF "-DRELAYOUT_TEST_DEFAULT_RANKS=1;2;4" \
	    $(CMAKE_FLAGS); fi
	cmake --build $(SANITIZE_BUILD) -j $(JOBS)
	cd $(SANITIZE_BUILD) && \
	  ASAN_OPTIONS=detect_leaks=1:detect_stack_use_after_return=$(SANITIZE_UAR) \
	  UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
	  HWLOC_PLUGINS_BLACKLIST=hwloc_pci \
	  ctest --output-on-failure -j $(JOBS) -LE "compile_fail|install|large"

# The layer on ranks spread over two test hosts (network namespaces joined by a veth link, each
# with its own hostname, /dev/shm and process tree) launched by hydra: paths A, B and direct
# checked and traced, the bytes on the link, a cut link and a stopped host (test/multihost/run.sh).
# Needs root; not part of `make test`. About 1-2 min on 2 cores.
test-multihost:
	@test/multihost/run.sh --preflight
	@$(MAKE) --no-print-directory configure
	cmake --build $(BUILD) -j $(JOBS) --target dsv4_layer relayout_cli
	BIN=$(BIN) test/multihost/run.sh

# Only the big layouts.
test-large: build
	cd $(BUILD) && ctest --output-on-failure -L large

# The main job: the distributed layer on 8 MPI ranks, path B (DeepEP) and path A (DP gather), each
# verified row by row against the single-rank reference.
demo: configure
	cmake --build $(BUILD) -j $(JOBS) --target dsv4_layer
	$(MPIEXEC) -n 8 $(BIN)/dsv4_layer --tp 8 --dp 4 --enable-dp-attention --moe-a2a-backend deepep --check
	@echo
	$(MPIEXEC) -n 8 $(BIN)/dsv4_layer --tp 8 --dp 4 --enable-dp-attention --check

# Optional packages of `make bench` only (never of `make test`): PyTorch for the layer's peer
# (bench/peers), perf for profiling. Installed when missing; the benchmarks run without them.
BENCH_PACKAGES := python3-torch linux-perf
bench: build
	@missing=""; for p in $(BENCH_PACKAGES); do \
	  dpkg-query -W -f='$${Status}' $$p 2>/dev/null | grep -q "install ok installed" || missing="$$missing $$p"; \
	done; \
	if [ -n "$$missing" ]; then \
	  echo "make bench: installing$$missing (optional)"; \
	  if [ "$$(id -u)" -ne 0 ]; then SUDO=sudo; else SUDO=; fi; \
	  ( $$SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq $$missing >/dev/null ) || \
	    echo "make bench: could not install$$missing; the benchmarks that need them are skipped"; \
	fi
	BIN=$(BIN) MPIEXEC=$(MPIEXEC) bench/run.sh

# bench_layer on two test hosts under slow links (docs/multihost.md). Root; a few minutes.
bench-multihost:
	@test/multihost/run.sh --preflight
	@$(MAKE) --no-print-directory configure
	cmake --build $(BUILD) -j $(JOBS) --target bench_layer
	BIN=$(BIN) test/multihost/bench.sh

clean:
	rm -rf $(BUILD)
