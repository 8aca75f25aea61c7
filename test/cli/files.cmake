# Files the programs read and write (relayout/io/files.hpp, apps/common/files.hpp): a FIFO, a device,
# a directory or a link where a file is expected is refused with exit 2 and a message naming the flag,
# never waited on or written through; an output is checked on every rank before the work. Included
# from CMakeLists.txt with cli, layer, dspark, mpi_line and the bad_traces fixture's ${bad} set.
# `timeout` turns a hang into exit 124, so a test fails on the exit code, not on time.
set(io ${CMAKE_CURRENT_BINARY_DIR}/io_files)
set(_rl_to "timeout -k 5 60")
# ASan needs more address space than any ulimit -v: under it /dev/zero's bound is tested without one.
if(CMAKE_CXX_FLAGS MATCHES "sanitize=address")
  set(_rl_vlimit true)
else()
  set(_rl_vlimit "ulimit -v 4000000")
endif()
set(_rl_out_rule "not a file: an output is a regular file, new or replaced whole\n$")

# name | setup (sh, %D% is the test's own fresh directory) | command | exit code | stderr regex
foreach(case
    "fifo_lock_dsv4_layer|mkfifo %D%/t/.relayout-trace.lock|${mpi_line} 2 ${layer} --tp 2 --trace %D%/t|2|^error: --trace [^ ]*/t: [^ ]*/t/.relayout-trace.lock is a FIFO, not a lock file \\(a regular file a run creates\\). remove it\n$"
    "fifo_lock_dspark_step|mkfifo %D%/t/.relayout-trace.lock|${mpi_line} 2 ${dspark} --tp 2 --draft dense --requests-per-group 2 --trace %D%/t|2|^error: --trace [^ ]*/t: [^ ]*/t/.relayout-trace.lock is a FIFO, not a lock file"
    "fifo_expert_load|mkfifo %D%/load.json|${cli} plan --tp 2 --expert-load %D%/load.json|2|^error: --expert-load [^ ]*/load.json: a FIFO, not an expert-load file \\(an expert-load file is a regular JSON file, as dsv4_layer --expert-load-out writes\\)\n$"
    "fifo_expert_load_out|mkfifo %D%/out.json|${mpi_line} 2 ${layer} --tp 2 --moe-a2a-backend deepep --expert-load-out %D%/out.json|2|^error: --expert-load-out [^ ]*/out.json: a FIFO, ${_rl_out_rule}"
    "expert_load_dev_zero|${_rl_vlimit}|${cli} plan --tp 2 --expert-load /dev/zero|2|^error: --expert-load /dev/zero: a device, not an expert-load file"
    "expert_load_too_large|truncate -s 65M %D%/load.json|${cli} plan --tp 2 --expert-load %D%/load.json|2|^error: --expert-load [^ ]*/load.json: 68,157,440 bytes, more than an expert-load file may have \\(67,108,864 bytes\\). not read\n$"
    "expert_load_link|echo '{}' > %D%/real.json && ln -s real.json %D%/load.json|${cli} plan --tp 2 --expert-load %D%/load.json|2|^error: --expert-load [^ ]*/load.json: a symbolic link \\(to real.json\\), not an expert-load file: an input is not read through a link. name the file itself\n$"
    "expert_load_out_dev_full|true|${mpi_line} 2 ${layer} --tp 2 --moe-a2a-backend deepep --expert-load-out /dev/full|2|^error: --expert-load-out /dev/full: a device, ${_rl_out_rule}"
    "expert_load_out_directory_np2|mkdir %D%/out|${mpi_line} 2 ${layer} --tp 2 --moe-a2a-backend deepep --expert-load-out %D%/out|2|^error: --expert-load-out [^ ]*/out: a directory, ${_rl_out_rule}"
    "expert_load_out_no_directory|true|${mpi_line} 2 ${layer} --tp 2 --moe-a2a-backend deepep --expert-load-out %D%/none/out.json|2|^error: --expert-load-out [^ ]*/none/out.json: cannot create a file in [^ ]*/none \\(No such file or directory\\)\n$"
    "lock_symlink|ln -s %D%/victim %D%/t/.relayout-trace.lock|${mpi_line} 2 ${layer} --tp 2 --trace %D%/t|2|^error: --trace [^ ]*/t: [^ ]*/t/.relayout-trace.lock is a symbolic link \\(to [^ ]*/victim\\): a run never writes through a link it did not create. remove it\n$"
    "lock_hard_link|ln %D%/victim %D%/t/.relayout-trace.lock|${mpi_line} 2 ${layer} --tp 2 --trace %D%/t|2|^error: --trace [^ ]*/t: [^ ]*/t/.relayout-trace.lock has 2 hard links: a run never writes a file another name shares. remove it\n$"
    "rank0_symlink|ln -s %D%/victim %D%/t/rank0.jsonl|${mpi_line} 2 ${layer} --tp 2 --trace %D%/t|2|^error: --trace [^ ]*/t: cannot write the trace there \\(trace: [^ ]*/t/rank0.jsonl: a symbolic link \\(to [^ ]*/victim\\): an output is not written through a link. remove it or name another file\\)\n$"
    "rank1_symlink|ln -s %D%/victim %D%/t/rank1.jsonl|${mpi_line} 2 ${layer} --tp 2 --trace %D%/t|2|^error: --trace [^ ]*/t: cannot write the trace there \\(trace: [^ ]*/t/rank1.jsonl: a symbolic link")
  string(REPLACE "|" ";" parts "${case}")
  list(GET parts 0 name)
  list(GET parts 1 setup)
  list(GET parts 2 command)
  list(GET parts 3 rc)
  list(GET parts 4 expect)
  set(d ${io}/${name})
  string(REPLACE "%D%" "${d}" setup "${setup}")
  string(REPLACE "%D%" "${d}" command "${command}")
  # After the run: exit 99 when the victim's bytes changed (written through a link), 98 when a rank
  # file, an output or a temporary file was left behind.
  relayout_add_command_test(files_${name} LABELS bad_input EXPECT_RC ${rc} STDERR "${expect}" STDOUT "^$"
    COMMAND sh -c "rm -rf ${d} && mkdir -p ${d}/t && echo 'user data' > ${d}/victim && ${setup} && ${_rl_to} ${command}
rc=$?
[ \"$(cat ${d}/victim)\" = 'user data' ] || exit 99
find ${d} -name '*.tmp-*' -o -type f -name 'rank*.jsonl' -o -type f -name 'out.json' | grep -q . && exit 98
exit $rc")
  set_tests_properties(files_${name} PROPERTIES PROCESSORS 2)
endforeach()

# relayout trace diff of a directory holding a FIFO named as the lock: no run's lock, not waited on.
relayout_add_command_test(files_fifo_lock_trace_diff LABELS bad_input
  COMMAND sh -c "rm -rf ${io}/diff && mkdir -p ${io} && cp -r ${bad}/base ${io}/diff && rm -f ${io}/diff/.relayout-trace.lock && mkfifo ${io}/diff/.relayout-trace.lock && ${_rl_to} ${cli} trace diff ${bad}/base ${io}/diff"
  STDOUT "^trace diff: .*traces agree")
set_tests_properties(files_fifo_lock_trace_diff PROPERTIES FIXTURES_REQUIRED bad_traces)

# An output replaced whole: the file a run wrote is read back by relayout plan, nothing left beside it.
relayout_add_command_test(files_expert_load_out_replaced LABELS bad_input
  COMMAND sh -c "rm -rf ${io}/replaced && mkdir -p ${io}/replaced && echo old > ${io}/replaced/out.json && ${mpi_line} 2 ${layer} --tp 2 --moe-a2a-backend deepep --expert-load-out ${io}/replaced/out.json >/dev/null 2>&1 && [ $(ls -A ${io}/replaced | wc -l) = 1 ] && ${cli} plan --tp 2 --moe-a2a-backend deepep --expert-load ${io}/replaced/out.json --format json"
  STDOUT "\"expert_load_factors\": \\[")
set_tests_properties(files_expert_load_out_replaced PROPERTIES PROCESSORS 2)
