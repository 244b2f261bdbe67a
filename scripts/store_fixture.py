#!/usr/bin/env python3
"""Writes what this build's gateway stores, as a fixture the next releases must read.

    scripts/store_fixture.py NAME [BINARY]

Runs BINARY (default target/debug/a2a-gateway) on a SQLite file and on a PostgreSQL schema
(POSTGRES_URL, default the local server's database test), makes tasks of every kind the
store keeps (finished, streamed with its resume log, a conversation's follow-up, an A2A 0.1
client's named task) and an agent through the admin API, reads them back, stops the
gateway cleanly and writes to tests/fixtures/store/NAME/:

- gateway.db: the SQLite file;
- postgres.sql: the schema's dump (pg_dump --inserts) as plain SQL, its name replaced by
  __SCHEMA__;
- gateway.toml: the configuration the gateway ran with (the store's lines are the test's);
- calls.sqlite.json, calls.postgres.json: each read and its answer on that store, which
  tests/api/upgrade.rs replays against the fixture with the current build and compares.

Never edit a fixture: a release that changes the schema adds one (NAME: the version that
wrote it).
"""

import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
import uuid

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ADMIN = "fixture-admin-secret"
POSTGRES_URL = os.environ.get("POSTGRES_URL", "postgres://postgres@127.0.0.1:5432/test")

GATEWAY = f"""default_agent = "echo"

[admin]

[[admin.keys]]
id = "ops"
secret_sha256 = "{hashlib.sha256(ADMIN.encode()).hexdigest()}"
"""


def call(base, path, body=None, method="POST", headers=None):
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(base + path, data=data, method=method)
    req.add_header("Content-Type", "application/json")
    for k, v in (headers or {}).items():
        req.add_header(k, v)
    with urllib.request.urlopen(req, timeout=10) as resp:
        return resp.read().decode()


def rpc(method, params, id=1):
    return {"jsonrpc": "2.0", "id": id, "method": method, "params": params}


def message(text, context=None, task=None):
    m = {"role": "ROLE_USER", "messageId": str(uuid.uuid4()), "parts": [{"text": text}]}
    if context:
        m["contextId"] = context
    if task:
        m["taskId"] = task
    return m


V1 = {"A2A-Version": "1.0"}


def make(base):
    """The writes: returns the reads to replay, each with its answer."""
    sent = json.loads(call(base, "/a2a/agents/echo", rpc("SendMessage", {"message": message("hello fixture")}), headers=V1))
    task = sent["result"]["task"]
    follow = json.loads(call(base, "/a2a/agents/echo", rpc("SendMessage", {"message": message("again", context=task["contextId"])}), headers=V1))
    streamed = call(base, "/a2a/agents/echo", rpc("SendStreamingMessage", {"message": message("streamed fixture")}), headers=V1)
    stream_task = None
    for line in streamed.splitlines():
        if line.startswith("data:"):
            event = json.loads(line[5:])["result"]
            stream_task = stream_task or (event.get("task") or {}).get("id") or (event.get("statusUpdate") or {}).get("taskId")
    legacy = {"jsonrpc": "2.0", "id": 7, "method": "tasks/send", "params": {
        "id": "fixture-legacy-1", "message": {"role": "user", "parts": [{"type": "text", "text": "old client"}]}}}
    call(base, "/a2a/agents/echo", legacy)
    admin = {"Authorization": f"Bearer {ADMIN}"}
    call(base, "/admin/v1/agents/fixture-runtime", {"description": "made at runtime", "backend": {"kind": "echo"}}, method="PUT", headers=admin)

    reads = [
        ("/a2a/agents/echo", rpc("GetTask", {"id": task["id"]}), V1),
        ("/a2a/agents/echo", rpc("GetTask", {"id": follow["result"]["task"]["id"]}), V1),
        ("/a2a/agents/echo", rpc("GetTask", {"id": stream_task, "historyLength": 1}), V1),
        ("/a2a/agents/echo", rpc("ListTasks", {"pageSize": 10}), V1),
        ("/a2a/agents/echo", {"jsonrpc": "2.0", "id": 8, "method": "tasks/get", "params": {"id": "fixture-legacy-1"}}, {}),
        ("/admin/v1/agents/fixture-runtime", None, admin),
    ]
    out = []
    for path, body, headers in reads:
        answer = call(base, path, body, method="POST" if body is not None else "GET", headers=headers)
        out.append({"path": path, "body": body, "headers": headers, "answer": json.loads(answer)})
    return out


def run(binary, workdir, store_lines):
    with open(os.path.join(workdir, "gateway.toml"), "w") as f:
        f.write(GATEWAY + store_lines)
    log = open(os.path.join(workdir, "gateway.log"), "w+")
    proc = subprocess.Popen(
        [binary, "serve", "--port", "0", "--config", "gateway.toml", "--agents-dir", os.path.join(ROOT, "agents.d")],
        cwd=workdir, stdout=log, stderr=subprocess.STDOUT)
    base = None
    deadline = time.time() + 30
    while base is None and time.time() < deadline and proc.poll() is None:
        with open(log.name) as f:
            for line in f:
                if "listening on http://" in line:
                    base = "http://" + line.split("http://", 1)[1].split()[0].rstrip("/")
        time.sleep(0.1)
    if base is None:
        proc.kill()
        with open(log.name) as f:
            sys.exit(f"the gateway did not start:\n{f.read()}")
    try:
        return make(base)
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=30)


def psql(*args):
    return subprocess.run(["psql", POSTGRES_URL, "-qAt", *args], check=True, capture_output=True, text=True).stdout


def main():
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    name = sys.argv[1]
    binary = sys.argv[2] if len(sys.argv) > 2 else os.path.join(ROOT, "target/debug/a2a-gateway")
    out = os.path.join(ROOT, "tests/fixtures/store", name)
    if os.path.exists(out):
        sys.exit(f"{out} exists: fixtures are never rewritten")
    os.makedirs(out)
    with tempfile.TemporaryDirectory() as work:
        calls = run(binary, work, '\n[store]\nkind = "sqlite"\ndata_dir = "data"\n')
        shutil.copy(os.path.join(work, "data/gateway.db"), os.path.join(out, "gateway.db"))
        with open(os.path.join(out, "calls.sqlite.json"), "w") as f:
            json.dump(calls, f, indent=1)
    schema = f"a2a_fixture_{uuid.uuid4().hex}"
    try:
        with tempfile.TemporaryDirectory() as work:
            calls = run(binary, work, f'\n[store]\nkind = "postgres"\nurl = "{POSTGRES_URL}"\nschema = "{schema}"\n')
        dump = subprocess.run(["pg_dump", "--inserts", "--no-owner", "--no-privileges", "-n", schema, POSTGRES_URL],
                              check=True, capture_output=True, text=True).stdout
        with open(os.path.join(out, "postgres.sql"), "w") as f:
            # psql's meta-commands (\restrict) are not SQL: the test runs the dump as SQL.
            sql = "".join(line for line in dump.splitlines(keepends=True) if not line.startswith("\\"))
            f.write(sql.replace(schema, "__SCHEMA__"))
        with open(os.path.join(out, "calls.postgres.json"), "w") as f:
            json.dump(calls, f, indent=1)
    finally:
        psql("-c", f"set client_min_messages to warning; drop schema if exists {schema} cascade")
    with open(os.path.join(out, "gateway.toml"), "w") as f:
        f.write(GATEWAY)
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
