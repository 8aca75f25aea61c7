# Sourced by bench/run.sh with BIN and MPIEXEC set: dsv4_layer against the same layer in PyTorch
# (torch_layer.py), np 1, one thread each, runs alternating. Needs a python3 with torch (Debian
# python3-torch, which `make bench` installs); skipped without it.
_rl_py=""
for _rl_cand in /usr/bin/python3 python3; do
  if command -v "$_rl_cand" >/dev/null 2>&1 && "$_rl_cand" -c 'import torch' >/dev/null 2>&1; then
    _rl_py=$_rl_cand
    break
  fi
done
if [ -z "$_rl_py" ]; then
  echo "no python3 with torch (apt-get install python3-torch): PyTorch peer skipped"
elif [ ! -x "$BIN/dsv4_layer" ]; then
  echo "dsv4_layer not built: PyTorch peer skipped"
else
  "$_rl_py" bench/peers/compare.py --dsv4 "$BIN/dsv4_layer" --mpiexec "$MPIEXEC" --rounds 3 --repeat 5 \
    --tokens 128,1024
fi
