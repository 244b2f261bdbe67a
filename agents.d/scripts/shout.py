#!/usr/bin/env python3
"""Text-mode command agent: repeats each input line in capitals, one output line per input
line (each streamed as an artifact chunk), then a word count."""
import sys

words = 0
for line in sys.stdin:
    line = line.rstrip("\n")
    words += len(line.split())
    print(line.upper(), flush=True)
print(f"({words} words)", flush=True)
