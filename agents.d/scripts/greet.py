#!/usr/bin/env python3
"""jsonl-mode command agent with an input-required step: greeted without a name, it asks
for one; the follow-up message (its text is the name) gets the greeting."""
import json
import sys

message = json.loads(sys.stdin.readline())
text = "".join(p.get("text", "") for p in message.get("parts", [])).strip()
if not text or text.lower() in ("hi", "hello", "hey"):
    print(json.dumps({"inputRequired": "What is your name?"}), flush=True)
else:
    print(json.dumps({"status": "working", "message": "composing a greeting"}), flush=True)
    print(json.dumps({"artifact": {"data": {"name": text}}, "name": "who", "lastChunk": True}), flush=True)
    print(json.dumps({"result": f"Hello, {text}!"}), flush=True)
