#!/usr/bin/env python3
"""jsonl-mode command agent with an input-required step: greeted without a name, it asks
for one and waits; the task's follow-up message arrives as the next stdin line, and the
same process greets that name. When the gateway gives up on the answer (the task was
canceled, timed out, or made room for others) it closes stdin: the end of input means
nobody is left to answer, so the program exits quietly instead of waiting for SIGTERM."""
import json
import sys


def emit(event):
    print(json.dumps(event), flush=True)


def text_of(line):
    message = json.loads(line)
    return "".join(p.get("text", "") for p in message.get("parts", [])).strip()


line = sys.stdin.readline()
if not line:
    sys.exit(0)  # no message at all: nothing to greet
name = text_of(line)
while not name or name.lower() in ("hi", "hello", "hey"):
    emit({"inputRequired": "What is your name?"})
    line = sys.stdin.readline()
    if not line:
        sys.exit(0)  # the gateway closed our input: nobody is left to answer
    name = text_of(line)

emit({"status": "working", "message": "composing a greeting"})
emit({"artifact": {"data": {"name": name}}, "name": "who", "lastChunk": True})
emit({"result": f"Hello, {name}!"})
