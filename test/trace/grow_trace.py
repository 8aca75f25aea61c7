#!/usr/bin/env python3
"""Grows a real one-rank trace into a large one that is still valid, for measuring `relayout trace
diff` on big inputs (docs/trace.md, "Memory and time").

    grow_trace.py SOURCE_DIR OUT_DIR BYTES

SOURCE_DIR holds rank0.jsonl of a complete one-rank run (e.g. `dsv4_layer --tp 1 --trace DIR
--requests 400,400`) whose rows are all of step 0. OUT_DIR/rank0.jsonl gets its header, then its
records again and again, copy k with every row's step set to k (a new forward of its own: the same
boundaries, the same global_num_tokens, rows no other copy holds), until the file reaches BYTES,
then the end line counting them. The result agrees with itself under `trace diff`.
"""
import json
import os
import re
import sys


def main():
    if len(sys.argv) != 4:
        sys.exit(__doc__)
    src, out_dir, target = sys.argv[1], sys.argv[2], int(float(sys.argv[3]))
    with open(os.path.join(src, "rank0.jsonl")) as f:
        lines = f.read().splitlines()
    header, records, end = lines[0], lines[1:-1], lines[-1]
    if json.loads(header).get("world_size") != 1 or not json.loads(end).get("end"):
        sys.exit(f"{src}/rank0.jsonl: expected a complete trace of a one-rank run")
    # Each record split where its rows' step is written: "[request,position,0," -> parts around it.
    row_step = re.compile(r"\[(\d+),(\d+),0,")
    templates = []
    for line in records:
        if re.search(r"\[\d+,\d+,[1-9]\d*,", line):
            sys.exit(f"{src}/rank0.jsonl: a row of a step other than 0; grow a prefill-only trace")
        templates.append(row_step.sub(lambda m: f"[{m.group(1)},{m.group(2)},\x00,", line).split("\x00"))
    os.makedirs(out_dir, exist_ok=True)
    written, count, step = 0, 0, 0
    with open(os.path.join(out_dir, "rank0.jsonl"), "w") as f:
        f.write(header + "\n")
        written += len(header) + 1
        while written < target:
            s = str(step)
            for parts in templates:
                text = s.join(parts) + "\n"
                f.write(text)
                written += len(text)
                count += 1
            step += 1
        f.write(json.dumps({"end": True, "records": count}, separators=(",", ":")) + "\n")
    print(f"{out_dir}/rank0.jsonl: {written} bytes, {count} records, {step} steps")


if __name__ == "__main__":
    main()
