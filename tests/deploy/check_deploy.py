#!/usr/bin/env python3
"""Offline checks of deploy/: every file is valid on its own terms, and all of them agree
with each other and with the gateway's own defaults.

    check_deploy.py --port 8080 --health-path /a2a/health --ready-path /a2a/ready \\
        --metrics-path /metrics [--gateway-bin PATH] [--live-port N] [--root DIR]

Run through scripts/deploy-check.sh, which installs kubernetes-validate and PyYAML.

- Kubernetes (deploy/kubernetes): each directory's kustomization.yaml lists every manifest
  there and only existing ones; each object validates against the Kubernetes JSON schemas
  bundled with kubernetes-validate (strict: unknown fields fail), offline. Then each variant
  (a kustomization no other one includes: single/, replicated/, replicated-postgres/), as
  kustomize renders it
  (and `kubectl kustomize` where installed): selectors, ports, probes, Prometheus
  annotations, the Secret reference, the volumes and mount paths, the args' config paths,
  the security context and the grace period agree; the ConfigMaps (or Secret) hold the
  repository's gateway.toml (host 0.0.0.0; [rate_limits] and a Redis [store] may differ)
  and agents.d/ files byte for byte; trusted_proxies is set. More than one replica (the
  workload's, or an HPA's maxReplicas) needs a store they share (Redis, at a Service of the
  manifests in front of one Redis, or PostgreSQL, the gateway's pods may reach); SQLite needs its data
  directory on a PersistentVolumeClaim, and a workload that never runs two pods at once.
- Dockerfile: EXPOSE, HEALTHCHECK (run here against stub servers: 200 on the ready path
  passes; 503, a wrong path or a closed port fail), CMD paths against COPY destinations,
  the non-root user; nothing it COPYs is excluded by .dockerignore.
- compose.yaml: services, port mapping, mounted files, upstream agent files pointing at
  compose services on the ports they listen on, the Prometheus scrape target and path; and
  `docker compose config -q` when the compose plugin is installed.
- compose.replicas.yaml, compose.replicas-postgres.yaml: the replicas share one Redis (one
  PostgreSQL schema), nginx's upstream is every replica,
  unbuffered, never passing a send that reached one replica on to another
  (non_idempotent), and the replicas trust nginx's network for X-Forwarded-For.
- Every compose file: more than one gateway (services, or deploy.replicas) needs a store
  they share.
- systemd unit: ExecStart paths, reload by SIGHUP, stop by SIGTERM within TimeoutStopSec,
  the sandbox; `systemd-analyze verify` when installed.
- With --gateway-bin: `a2a-gateway check` accepts the image's, the compose and the
  Kubernetes configuration (materialised as the kubelet projects it); every flag and
  A2A_GATEWAY_* variable used is one the binary knows; the schema's server.port default is
  --port. With --live-port: the Dockerfile HEALTHCHECK passes against a running gateway.
  With --root: the repository to check is DIR (a modified copy, say) rather than the one
  holding this script.

Prints what was checked and every problem found, precisely; exit status 1 on any problem.
"""

from __future__ import annotations

import argparse
import base64
import http.server
import importlib.metadata
import ipaddress
import json
import os
import re
import shlex
import shutil
import socket
import stat
import subprocess
import sys
import tempfile
import threading
import tomllib
from pathlib import Path, PurePosixPath
from urllib.parse import urlsplit

try:
    import kubernetes_validate
    import yaml
except ImportError as e:  # pragma: no cover - the venv script installs them
    sys.exit(f'check_deploy: ERROR: {e}; run it through scripts/deploy-check.sh')



def set_root(root: Path) -> None:
    """The repository whose deploy/ (and gateway.toml, agents.d/, ...) is checked."""
    global ROOT, DEPLOY, K8S, DOCKERFILE, COMPOSE, REPLICAS, REPLICAS_PG, UNIT, DOCKERIGNORE
    ROOT = root.resolve()
    DEPLOY = ROOT / 'deploy'
    K8S = DEPLOY / 'kubernetes'
    DOCKERFILE = DEPLOY / 'Dockerfile'
    COMPOSE = DEPLOY / 'compose.yaml'
    REPLICAS = DEPLOY / 'compose.replicas.yaml'
    REPLICAS_PG = DEPLOY / 'compose.replicas-postgres.yaml'
    UNIT = DEPLOY / 'systemd' / 'a2a-gateway.service'
    DOCKERIGNORE = ROOT / '.dockerignore'


set_root(Path(__file__).resolve().parents[2])

# Kubernetes versions validated against: an older one still widely run, and the newest the
# installed kubernetes-validate bundles (appended at run time).
K8S_FLOOR = '1.30'
# The image's user; Kubernetes runs it as this uid too.
RUN_AS_UID = 10001
# Every A2A_GATEWAY_* variable the gateway reads outside clap (tracing's filter).
ENV_OUTSIDE_CLAP = {'A2A_GATEWAY_LOG'}
# Used when no --gateway-bin gives the real list (`serve --help`).
KNOWN_ENV_FALLBACK = {
    'A2A_GATEWAY_CONFIG', 'A2A_GATEWAY_AGENTS_DIR', 'A2A_GATEWAY_HOST', 'A2A_GATEWAY_PORT',
    'A2A_GATEWAY_WORKERS', 'A2A_GATEWAY_AUTH_TOKEN', 'A2A_GATEWAY_LOG',
    'A2A_GATEWAY_LOG_FORMAT',
}
KNOWN_FLAGS_FALLBACK = {
    '--config', '--agents-dir', '--host', '--port', '--workers', '--auth-token',
    '--log-format',
}
CONFIGMAP_KEY = re.compile(r'^[-._a-zA-Z0-9]+$')


def rel(path: Path) -> str:
    try:
        return str(Path(path).resolve().relative_to(ROOT))
    except ValueError:
        return str(path)


class Report:
    def __init__(self) -> None:
        self.problems: list[str] = []
        self.done: list[str] = []

    def fail(self, where: str | Path, message: str) -> None:
        where = rel(where) if isinstance(where, Path) else where
        line = f'{where}: {message}'
        if line not in self.problems:
            self.problems.append(line)

    def skipped(self, what: str) -> None:
        """Records a check not done here (a tool not installed), so the summary says so."""
        self.done.append(f'n/a  {what}')

    def mark(self) -> int:
        return len(self.problems)

    def ok(self, what: str, since: int | None = None) -> None:
        """Records a check done; with `since` (a mark), as failed if problems came since."""
        failed = since is not None and len(self.problems) > since
        self.done.append(f'{"FAIL" if failed else "ok  "} {what}')

    def expect(self, cond: bool, where: str | Path, message: str) -> bool:
        if not cond:
            self.fail(where, message)
        return cond


# ---------------------------------------------------------------------------- helpers

def serve_paths(argv: list[str], where: str, r: Report) -> dict[str, str]:
    """The values of --config/--agents-dir (and any other --flag) after `serve`."""
    if not argv or argv[0] != 'serve':
        r.fail(where, f'the command must start with "serve", got {argv!r}')
        return {}
    flags: dict[str, str] = {}
    i = 1
    while i < len(argv):
        arg = argv[i]
        if not arg.startswith('--'):
            r.fail(where, f'unexpected argument {arg!r} in {argv!r}')
            i += 1
            continue
        if '=' in arg:
            name, value = arg.split('=', 1)
            flags[name] = value
            i += 1
        elif i + 1 < len(argv):
            flags[arg] = argv[i + 1]
            i += 2
        else:
            r.fail(where, f'flag {arg} has no value in {argv!r}')
            i += 1
    for needed in ('--config', '--agents-dir'):
        if needed not in flags:
            r.fail(where, f'serve has no {needed}: {argv!r}')
    return flags


def duration_secs(value, where: str, r: Report) -> float | None:
    """'30s', '1m30s', '1500ms', 30 -> seconds (compose and systemd spellings)."""
    if isinstance(value, (int, float)):
        return float(value)
    text = str(value).strip().replace(' ', '')
    if re.fullmatch(r'\d+(\.\d+)?', text):
        return float(text)
    total, pos = 0.0, 0
    units = {'h': 3600, 'min': 60, 'm': 60, 'sec': 1, 's': 1, 'ms': 0.001, 'us': 1e-6}
    for m in re.finditer(r'(\d+(?:\.\d+)?)(ms|us|min|sec|h|m|s)', text):
        if m.start() != pos:
            break
        total += float(m.group(1)) * units[m.group(2)]
        pos = m.end()
    if pos != len(text) or pos == 0:
        r.fail(where, f'cannot read the duration {value!r}')
        return None
    return total


def read_toml(path: Path, r: Report, text: str | None = None) -> dict | None:
    try:
        return tomllib.loads(text if text is not None else path.read_text())
    except (tomllib.TOMLDecodeError, OSError) as e:
        r.fail(path, f'not valid TOML: {e}')
        return None


def check_schema_line(path: Path, schema: str, r: Report) -> None:
    """The first line names the JSON schema by a path relative to the file."""
    first = path.read_text().split('\n', 1)[0]
    m = re.fullmatch(r'#:schema (\S+)', first)
    if not r.expect(bool(m), path, f'the first line must be "#:schema <relative path to '
                    f'docs/schema/{schema}>", got {first!r}'):
        return
    target = (path.parent / m.group(1)).resolve()
    want = (ROOT / 'docs' / 'schema' / schema).resolve()
    r.expect(target == want, path, f'#:schema {m.group(1)} resolves to {rel(target)}, '
             f'not docs/schema/{schema}')


def gateway_agent_refs(cfg: dict, names: set[str], where: str, r: Report) -> None:
    """default_agent and routing rules name agents that exist."""
    default = cfg.get('default_agent')
    if default is not None:
        r.expect(default in names, where,
                 f'default_agent "{default}" is none of the agents {sorted(names)}')
    for i, rule in enumerate(cfg.get('routing', {}).get('rules', [])):
        agent = rule.get('agent')
        r.expect(agent in names, where,
                 f'routing.rules[{i}].agent "{agent}" is none of the agents {sorted(names)}')


def toml_diff(want, got, path: str = '') -> list[str]:
    """Where two parsed TOML documents differ, as dotted keys with both values."""
    if isinstance(want, dict) and isinstance(got, dict):
        out = []
        for k in sorted(set(want) | set(got)):
            sub = f'{path}.{k}' if path else k
            if k not in got:
                out.append(f'{sub} missing (repository: {want[k]!r})')
            elif k not in want:
                out.append(f'{sub} = {got[k]!r} is not in the repository\'s file')
            else:
                out += toml_diff(want[k], got[k], sub)
        return out
    if isinstance(want, list) and isinstance(got, list) and len(want) == len(got):
        return [d for i, (w, g) in enumerate(zip(want, got))
                for d in toml_diff(w, g, f'{path}[{i}]')]
    return [] if want == got else [f'{path} = {got!r} (repository: {want!r})']


def metrics_port(cfg: dict | None, port: int, where: str, r: Report) -> int:
    """The port /metrics is served on: [metrics] listen's, else the main port."""
    metrics = (cfg or {}).get('metrics', {})
    r.expect(metrics.get('enabled', True) is not False, where,
             '[metrics] enabled = false: nothing would serve the scraped /metrics')
    listen = metrics.get('listen')
    if listen:
        m = re.search(r':(\d+)$', str(listen))
        if r.expect(bool(m), where, f'[metrics] listen {listen!r} has no port'):
            return int(m.group(1))
    return port


def shutdown_grace(cfg: dict | None, default: float) -> float:
    if cfg:
        value = cfg.get('server', {}).get('shutdown_grace_secs')
        if isinstance(value, (int, float)):
            return float(value)
    return default


# ---------------------------------------------------------------------------- .dockerignore

def _pattern_regex(pattern: str) -> re.Pattern:
    """A .dockerignore pattern as moby/patternmatcher reads it (Go filepath.Match plus **)."""
    out, i = '', 0
    while i < len(pattern):
        c = pattern[i]
        if c == '*':
            if pattern[i:i + 2] == '**':
                i += 2
                if pattern[i:i + 1] == '/':
                    out += '(?:.*/)?'
                    i += 1
                else:
                    out += '.*'
                continue
            out += '[^/]*'
        elif c == '?':
            out += '[^/]'
        elif c == '\\' and i + 1 < len(pattern):
            i += 1
            out += re.escape(pattern[i])
        elif c == '[':
            end = pattern.find(']', i + 1)
            if end < 0:
                out += re.escape(c)
            else:
                cls = pattern[i + 1:end]
                if cls.startswith('^'):
                    cls = '!' + cls[1:]
                out += '[' + ('^' + cls[1:] if cls.startswith('!') else cls) + ']'
                i = end
        else:
            out += re.escape(c)
        i += 1
    return re.compile(f'^{out}$')


class DockerIgnore:
    def __init__(self, path: Path):
        self.rules: list[tuple[bool, re.Pattern, str]] = []
        if not path.exists():
            return
        for line in path.read_text().splitlines():
            line = line.strip()
            if not line or line.startswith('#'):
                continue
            negate = line.startswith('!')
            pat = line[1:].strip() if negate else line
            pat = os.path.normpath(pat).lstrip('/')
            self.rules.append((negate, _pattern_regex(pat), line))

    def excluded(self, relpath: str) -> bool:
        parts = PurePosixPath(relpath).parts
        candidates = ['/'.join(parts[:n]) for n in range(1, len(parts) + 1)]
        result = False
        for negate, rx, _ in self.rules:
            if any(rx.match(c) for c in candidates):
                result = not negate
        return result


def check_copy_sources(dockerfile: Path, copies: list[dict], ignore: DockerIgnore,
                       r: Report) -> None:
    """Every file a COPY (from the build context) takes exists and is not .dockerignored."""
    for cp in copies:
        if cp['from']:
            continue
        for src in cp['sources']:
            path = ROOT / src
            if not r.expect(path.exists(), dockerfile,
                            f'COPY source {src} does not exist in the build context'):
                continue
            files = [path] if path.is_file() else [
                p for p in path.rglob('*') if p.is_file() and '__pycache__' not in p.parts]
            r.expect(bool(files), dockerfile, f'COPY source {src} holds no files')
            for f in files:
                rp = f.relative_to(ROOT).as_posix()
                r.expect(not ignore.excluded(rp), DOCKERIGNORE,
                         f'{rp} is excluded, but {rel(dockerfile)} COPYs it ({src})')


# ---------------------------------------------------------------------------- Dockerfile

def dockerfile_instructions(path: Path) -> list[tuple[str, str, int]]:
    """(INSTRUCTION, arguments, line) with continuation lines joined, comments dropped."""
    out, buf, start = [], '', 0
    for n, raw in enumerate(path.read_text().splitlines(), 1):
        stripped = raw.strip()
        if stripped.startswith('#') or (not stripped and not buf):
            continue
        if not buf:
            start = n
        if stripped.endswith('\\'):
            buf += stripped[:-1] + ' '
            continue
        buf += stripped
        word, _, args = buf.strip().partition(' ')
        out.append((word.upper(), args.strip(), start))
        buf = ''
    return out


def exec_form(args: str, where: str, what: str, r: Report) -> list[str] | None:
    if not args.startswith('['):
        r.fail(where, f'{what} must be in exec form (a JSON array), so signals reach the '
               f'gateway: {args}')
        return None
    try:
        value = json.loads(args)
    except json.JSONDecodeError as e:
        r.fail(where, f'{what} is not a valid JSON array: {e}')
        return None
    if not (isinstance(value, list) and all(isinstance(x, str) for x in value)):
        r.fail(where, f'{what} must be an array of strings')
        return None
    return value


def parse_copy(args: str) -> dict:
    words = shlex.split(args) if not args.lstrip().startswith('[') else None
    flags = {}
    if words is None:
        parts = json.loads(args)
    else:
        parts = []
        for w in words:
            if w.startswith('--') and not parts:
                k, _, v = w[2:].partition('=')
                flags[k] = v
            else:
                parts.append(w)
    if words is not None and args.lstrip().startswith('--'):
        # flags then a JSON array: COPY --from=x ["a", "b"]
        rest = re.sub(r'^(\s*--\S+\s+)+', '', args)
        if rest.startswith('['):
            parts = json.loads(rest)
    return {'from': flags.get('from'), 'sources': parts[:-1], 'dest': parts[-1] if parts else ''}


def check_dockerfile(a, r: Report, ignore: DockerIgnore) -> dict:
    """Returns what the other checks compare against: binary path, config paths, uid."""
    since = r.mark()
    where = rel(DOCKERFILE)
    info = {'bin': None, 'config': None, 'agents_dir': None, 'env': {}, 'healthcheck': None,
            'flags': {}}
    if not r.expect(DOCKERFILE.is_file(), where, 'missing'):
        return info
    instrs = dockerfile_instructions(DOCKERFILE)
    stages: list[dict] = []
    for word, args, line in instrs:
        if word == 'FROM':
            m = re.fullmatch(r'(?:--\S+\s+)*(\S+)(?:\s+AS\s+(\S+))?', args, re.I)
            stages.append({'image': m.group(1) if m else args,
                           'name': m.group(2) if m else None, 'instrs': []})
        elif stages:
            stages[-1]['instrs'].append((word, args, line))
    if not r.expect(len(stages) >= 2, where, 'must be multi-stage (a builder, then a '
                    'runtime stage)'):
        return info
    builder, final = stages[0], stages[-1]
    r.expect(builder['image'] == 'rust:1-bookworm', where,
             f'the builder must be rust:1-bookworm, got {builder["image"]}')
    r.expect(final['image'] == 'debian:bookworm-slim', where,
             f'the runtime stage must be debian:bookworm-slim, got {final["image"]}')
    builds = [args for w, args, _ in builder['instrs'] if w == 'RUN' and 'cargo build' in args]
    if r.expect(bool(builds), where, 'the builder runs no `cargo build`'):
        cmd = builds[0]
        for flag in ('--release', '--locked'):
            r.expect(flag in cmd.split(), where, f'`cargo build` lacks {flag}: {cmd}')
    builder_copies = [parse_copy(args) for w, args, _ in builder['instrs'] if w == 'COPY']
    copied = {s.rstrip('/') for c in builder_copies for s in c['sources']}
    for needed in ('Cargo.toml', 'Cargo.lock', 'src'):
        r.expect(needed in copied, where, f'the builder does not COPY {needed}')

    # The runtime stage.
    workdir = '/'
    copies, env, expose = [], {}, []
    user = entry = cmd = stopsignal = health = None
    for word, args, line in final['instrs']:
        at = f'{where}:{line}'
        if word == 'WORKDIR':
            workdir = str(PurePosixPath(workdir) / args)
        elif word == 'COPY':
            cp = parse_copy(args)
            cp['dest'] = str(PurePosixPath(workdir) / cp['dest'])
            copies.append(cp)
        elif word == 'ENV':
            words = shlex.split(args)
            if words and '=' not in words[0]:
                env[words[0]] = ' '.join(words[1:])
            else:
                for w in words:
                    k, _, v = w.partition('=')
                    env[k] = v
        elif word == 'EXPOSE':
            expose += [p.split('/')[0] for p in args.split()]
        elif word == 'USER':
            user = args
        elif word == 'ENTRYPOINT':
            entry = exec_form(args, at, 'ENTRYPOINT', r)
        elif word == 'CMD':
            cmd = exec_form(args, at, 'CMD', r)
        elif word == 'STOPSIGNAL':
            stopsignal = args
        elif word == 'HEALTHCHECK':
            health = (args, at)
    info['env'] = env
    r.expect(workdir == '/etc/a2a-gateway', where,
             f'WORKDIR of the runtime stage is {workdir}, not /etc/a2a-gateway')
    r.expect(str(a.port) in expose, where,
             f'EXPOSE {" ".join(expose) or "(none)"} does not include the port {a.port}')
    r.expect(env.get('A2A_GATEWAY_HOST') == '0.0.0.0', where,
             'ENV A2A_GATEWAY_HOST=0.0.0.0 is missing (the default 127.0.0.1 is unreachable '
             'from outside the container)')
    r.expect(env.get('A2A_GATEWAY_LOG_FORMAT') == 'json', where,
             'ENV A2A_GATEWAY_LOG_FORMAT=json is missing')
    if 'A2A_GATEWAY_PORT' in env:
        r.expect(env['A2A_GATEWAY_PORT'] == str(a.port), where,
                 f'ENV A2A_GATEWAY_PORT={env["A2A_GATEWAY_PORT"]} is not {a.port}')
    uid = (user or '').split(':')[0]
    r.expect(uid == str(RUN_AS_UID), where,
             f'USER must be the numeric uid {RUN_AS_UID} (runAsNonRoot can only verify a '
             f'number), got {user!r}')
    r.expect(stopsignal == 'SIGTERM', where, f'STOPSIGNAL must be SIGTERM, got {stopsignal!r}')

    bin_copy = [c for c in copies if c['from']]
    if r.expect(bool(bin_copy), where, 'the runtime stage copies no binary from the builder'):
        info['bin'] = bin_copy[0]['dest']
        r.expect(info['bin'] == '/usr/local/bin/a2a-gateway', where,
                 f'the binary goes to {info["bin"]}, not /usr/local/bin/a2a-gateway')
    r.expect(entry == ['/usr/local/bin/a2a-gateway'], where,
             f'ENTRYPOINT must be ["/usr/local/bin/a2a-gateway"], got {entry!r}')
    if entry and info['bin']:
        r.expect(entry[0] == info['bin'], where,
                 f'ENTRYPOINT runs {entry[0]}, but the binary is copied to {info["bin"]}')
    if cmd is not None:
        flags = serve_paths(cmd, f'{where} CMD', r)
        info['flags'] = flags
        info['config'], info['agents_dir'] = flags.get('--config'), flags.get('--agents-dir')
        dests = {c['dest'].rstrip('/'): c for c in copies if not c['from']}
        cfg = info['config']
        if cfg:
            src = dests.get(cfg)
            if r.expect(src is not None, where, f'CMD --config {cfg} is no COPY destination '
                        f'(destinations: {sorted(dests)})'):
                r.expect(src['sources'] == ['gateway.toml'], where,
                         f'{cfg} is copied from {src["sources"]}, not the repository\'s '
                         'gateway.toml')
        agents = info['agents_dir']
        if agents:
            src = dests.get(agents.rstrip('/'))
            if r.expect(src is not None, where, f'CMD --agents-dir {agents} is no COPY '
                        f'destination (destinations: {sorted(dests)})'):
                r.expect([s.rstrip('/') for s in src['sources']] == ['agents.d'], where,
                         f'{agents} is copied from {src["sources"]}, not agents.d/')
    check_copy_sources(DOCKERFILE, builder_copies + copies, ignore, r)

    if r.expect(health is not None, where, 'no HEALTHCHECK'):
        args, at = health
        m = re.search(r'(?:^|\s)CMD\s+(.*)$', args)
        if r.expect(bool(m), at, f'HEALTHCHECK has no CMD: {args}'):
            argv = exec_form(m.group(1), at, 'HEALTHCHECK CMD', r)
            if argv:
                info['healthcheck'] = (argv, at)
                text = ' '.join(argv)
                r.expect(a.ready_path in text, at,
                         f'HEALTHCHECK does not request the ready path {a.ready_path}: {text}')
                r.expect(f'${{A2A_GATEWAY_PORT:-{a.port}}}' in text, at,
                         f'HEALTHCHECK must connect to ${{A2A_GATEWAY_PORT:-{a.port}}} (the '
                         f'port the gateway listens on): {text}')
                r.expect(argv[0] in ('bash', '/bin/bash', '/usr/bin/bash'), at,
                         'HEALTHCHECK must run bash (in debian:bookworm-slim; no curl there)')
    r.ok(f'Dockerfile: {len(stages)} stages, EXPOSE {" ".join(expose)}, CMD paths are COPY '
         'destinations, non-root USER, exec-form ENTRYPOINT/CMD', since)
    return info


class Stub(http.server.ThreadingHTTPServer):
    daemon_threads = True

    def handle_error(self, request, client_address):
        pass  # the health check hangs up after the status line: a reset is expected


def stub_server(answers: dict[str, int]) -> Stub:
    """127.0.0.1:<free port>; GET path -> the status in answers, else 404."""
    class Handler(http.server.BaseHTTPRequestHandler):
        protocol_version = 'HTTP/1.1'

        def do_GET(self):  # noqa: N802
            code = answers.get(self.path.split('?')[0], 404)
            body = b'{}'
            self.send_response(code)
            self.send_header('Content-Type', 'application/json')
            self.send_header('Content-Length', str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = Stub(('127.0.0.1', 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def free_port() -> int:
    with socket.socket() as s:
        s.bind(('127.0.0.1', 0))
        return s.getsockname()[1]


def run_healthcheck(argv: list[str], port: int) -> subprocess.CompletedProcess:
    env = dict(os.environ, A2A_GATEWAY_PORT=str(port))
    return subprocess.run(argv, env=env, capture_output=True, text=True, timeout=20)


def check_healthcheck_behaviour(a, info: dict, r: Report) -> None:
    """Runs the HEALTHCHECK command here, against stub servers and, with --live-port, the
    real gateway: it must pass only when the ready path answers 200."""
    if not info.get('healthcheck'):
        return
    argv, at = info['healthcheck']
    since = r.mark()
    if not r.expect(shutil.which(argv[0]) is not None, at,
                    f'{argv[0]} not found here, cannot run the HEALTHCHECK command'):
        return
    ready_ok = stub_server({a.ready_path: 200, a.health_path: 200})
    not_ready = stub_server({a.ready_path: 503, a.health_path: 200})
    health_only = stub_server({a.health_path: 200})
    try:
        cases = [
            ('200 on the ready path', ready_ok.server_address[1], True),
            ('503 on the ready path', not_ready.server_address[1], False),
            (f'200 on {a.health_path} only (404 on the ready path)',
             health_only.server_address[1], False),
            ('nothing listening', free_port(), False),
        ]
        for label, port, want in cases:
            try:
                res = run_healthcheck(argv, port)
            except subprocess.TimeoutExpired:
                r.fail(at, f'HEALTHCHECK hung (>20 s) with {label}')
                continue
            r.expect((res.returncode == 0) == want, at,
                     f'HEALTHCHECK exited {res.returncode} with {label}; expected '
                     f'{"success" if want else "failure"} ({res.stderr.strip()[:200]})')
    finally:
        for s in (ready_ok, not_ready, health_only):
            s.shutdown()
    r.ok('Dockerfile HEALTHCHECK run against stub servers: passes on 200, fails on 503, on a '
         'wrong path and on a closed port', since)
    if a.live_port:
        res = run_healthcheck(argv, a.live_port)
        if r.expect(res.returncode == 0, at,
                    f'HEALTHCHECK fails against the running gateway on port {a.live_port} '
                    f'(exit {res.returncode}): {res.stderr.strip()[:300]}'):
            r.ok(f'Dockerfile HEALTHCHECK passes against the live gateway on port {a.live_port}')


# ---------------------------------------------------------------------------- Kubernetes

def k8s_versions() -> list[str]:
    from kubernetes_validate import utils
    bundled = utils.all_versions()
    latest = utils.major_minor(bundled[-1])
    out = [K8S_FLOOR]
    if latest != K8S_FLOOR:
        out.append(latest)
    return out


def kustomize_tree(r: Report) -> dict[Path, list[Path]]:
    """Every kustomization under deploy/kubernetes: its directory -> what its `resources`
    lists (manifest files, and directories of other kustomizations, its bases). Checks that
    each is a Kustomization this check can read, that every resource exists and is listed
    once, and that every manifest is listed by the kustomization of its own directory."""
    trees: dict[Path, list[Path]] = {}
    if not r.expect(K8S.is_dir(), K8S, 'missing'):
        return trees
    for path in sorted(K8S.rglob('kustomization.yaml')):
        try:
            k = yaml.safe_load(path.read_text()) or {}
        except yaml.YAMLError as e:
            r.fail(path, f'not valid YAML: {e}')
            continue
        r.expect(k.get('apiVersion') == 'kustomize.config.k8s.io/v1beta1', path,
                 f'apiVersion must be kustomize.config.k8s.io/v1beta1, got '
                 f'{k.get("apiVersion")!r}')
        r.expect(k.get('kind') == 'Kustomization', path,
                 f'kind must be Kustomization, got {k.get("kind")!r}')
        unread = sorted(set(k) - {'apiVersion', 'kind', 'resources'})
        r.expect(not unread, path, f'{unread}: this check reads `resources` only, so what '
                 'it validates would not be what kubectl applies (extend '
                 'tests/deploy/check_deploy.py first)')
        listed = k.get('resources') or []
        dupes = sorted({n for n in listed if listed.count(n) > 1})
        r.expect(not dupes, path, f'resources lists {dupes} more than once')
        entries = []
        for name in listed:
            target = path.parent / name
            if target.is_dir():
                if r.expect((target / 'kustomization.yaml').is_file(), path,
                            f'resources lists {name}, a directory without a kustomization.yaml'):
                    entries.append(target.resolve())
            elif r.expect(target.is_file(), path, f'resources lists {name}, which does not '
                          'exist'):
                entries.append(target.resolve())
        trees[path.parent.resolve()] = entries
    r.expect(bool(trees), K8S, 'holds no kustomization.yaml')
    for f in sorted(K8S.rglob('*')):
        if f.suffix not in ('.yaml', '.yml') or f.name == 'kustomization.yaml':
            continue
        listing = trees.get(f.parent.resolve())
        if r.expect(listing is not None, f, 'no kustomization.yaml in its directory lists it'):
            r.expect(f.resolve() in listing, f.parent / 'kustomization.yaml',
                     f'{f.name} is not listed in resources (kubectl apply -k would leave it '
                     'out)')
    return trees


def kustomize_variants(trees: dict[Path, list[Path]]) -> list[Path]:
    """The kustomizations no other one includes: what an operator applies."""
    included = {e for entries in trees.values() for e in entries}
    return sorted(d for d in trees if d not in included)


def kustomize_files(d: Path, trees: dict[Path, list[Path]], r: Report,
                    seen: tuple[Path, ...] = ()) -> list[Path]:
    """The manifest files a kustomization renders, its bases' first, as kustomize does."""
    if d in seen:
        r.fail(d / 'kustomization.yaml', 'includes itself (through '
               f'{" -> ".join(rel(s) for s in seen)})')
        return []
    out = []
    for entry in trees.get(d, []):
        out += kustomize_files(entry, trees, r, seen + (d,)) if entry.is_dir() else [entry]
    return out


def validate_k8s(files: list[Path], versions: list[str], r: Report) -> dict[Path, list[dict]]:
    objs: dict[Path, list[dict]] = {}
    for f in files:
        try:
            docs = [d for d in yaml.safe_load_all(f.read_text()) if d is not None]
        except yaml.YAMLError as e:
            r.fail(f, f'not valid YAML: {e}')
            continue
        r.expect(bool(docs), f, 'holds no object')
        for doc in docs:
            name = f'{doc.get("kind")}/{doc.get("metadata", {}).get("name")}'
            for v in versions:
                try:
                    kubernetes_validate.validate(doc, v, strict=True)
                except kubernetes_validate.ValidationError as e:
                    path = '.'.join(str(p) for p in e.absolute_path) or '(root)'
                    r.fail(f, f'{name} is invalid for Kubernetes {v} at {path}: {e.message}')
                except kubernetes_validate.SchemaNotFoundError as e:
                    r.fail(f, f'{name}: {e.message}')
                except Exception as e:  # noqa: BLE001 - anything else is a failure too
                    r.fail(f, f'{name}: validation error for Kubernetes {v}: {e!r}')
        objs[f] = docs
    return objs


def selector_matches(selector: dict | None, labels: dict) -> bool:
    match = (selector or {}).get('matchLabels', selector or {})
    return bool(match) and all(labels.get(k) == v for k, v in match.items())


def probe_target(probe: dict | None) -> tuple[str | None, object]:
    http = (probe or {}).get('httpGet') or {}
    return http.get('path'), http.get('port')


def source_data(obj: dict) -> dict[str, str]:
    """The files a ConfigMap or Secret holds, as text."""
    if obj.get('kind') == 'Secret':
        out = {k: base64.b64decode(v).decode() for k, v in (obj.get('data') or {}).items()}
        out.update(obj.get('stringData') or {})
        return out
    return dict(obj.get('data') or {})


def volume_source(volume: dict) -> tuple[str, str, dict] | None:
    """(kind, name, spec) of a ConfigMap or Secret volume."""
    if 'configMap' in volume:
        return 'ConfigMap', volume['configMap'].get('name'), volume['configMap']
    if 'secret' in volume:
        return 'Secret', volume['secret'].get('secretName'), volume['secret']
    return None


def projection(spec: dict, data: dict[str, str]) -> list[tuple[str, str, int]]:
    """(path, text, mode) of each file a ConfigMap or Secret volume projects."""
    default_mode = spec.get('defaultMode', 0o644)
    items = spec.get('items')
    pairs = ([(i['path'], i['key'], i.get('mode', default_mode)) for i in items]
             if items else [(k, k, default_mode) for k in data])
    return [(path, data.get(key, ''), mode) for path, key, mode in pairs]


def materialise(files: list[tuple[str, str, int]], dest: Path) -> None:
    """Writes a volume's files as the kubelet projects them (paths, modes)."""
    for path, text, mode in files:
        target = dest / path
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text)
        target.chmod(mode)


def check_kustomize_render(d: Path, objs: list[tuple[dict, Path]], r: Report) -> None:
    """`kubectl kustomize` (offline) renders exactly the objects validated here."""
    kubectl = shutil.which('kubectl')
    if not kubectl:
        r.skipped(f'{rel(d)}: `kubectl kustomize` NOT run (kubectl not installed)')
        return
    where = rel(d / 'kustomization.yaml')
    try:
        res = subprocess.run([kubectl, 'kustomize', str(d)], capture_output=True, text=True,
                             timeout=60)
    except subprocess.TimeoutExpired:
        r.fail(where, '`kubectl kustomize` hung (> 60 s)')
        return
    if not r.expect(res.returncode == 0, where, f'`kubectl kustomize` fails: '
                    f'{res.stderr.strip()}'):
        return
    rendered = sorted((d.get('kind'), d.get('metadata', {}).get('name'))
                      for d in yaml.safe_load_all(res.stdout) if d)
    validated = sorted((d.get('kind'), d.get('metadata', {}).get('name')) for d, _ in objs)
    if r.expect(rendered == validated, where, f'`kubectl kustomize` renders {rendered}, but '
                f'the files hold {validated}'):
        r.ok(f'{rel(d)}: `kubectl kustomize` renders the same {len(rendered)} objects')


def trusted_networks(cfg: dict | None, where: str, r: Report, behind: str) -> list:
    """[rate_limits] trusted_proxies as networks; each must be an address or a network, and
    there must be some: behind a load balancer, without them every anonymous caller shares
    the balancer's one allowance."""
    proxies = ((cfg or {}).get('rate_limits') or {}).get('trusted_proxies') or []
    r.expect(bool(proxies), where, f'[rate_limits] trusted_proxies is not set: every call '
             f'comes through {behind}, so every anonymous caller would share its one rate '
             'allowance; name its network')
    nets = []
    for p in proxies:
        try:
            nets.append(ipaddress.ip_network(str(p).strip(), strict=False))
        except ValueError:
            r.fail(where, f'[rate_limits] trusted_proxies: {p!r} is neither an address nor a '
                   'network (10.0.0.0/8, fd00::/8)')
    return nets


def shares(store: dict) -> bool:
    """Whether replicas on `store` share it: Redis, or PostgreSQL with `shared = true`."""
    kind = store.get('kind', 'memory')
    return kind == 'redis' or (kind == 'postgres' and store.get('shared') is True)


def unshared_replicas(count: int, why: list[str], store: dict, where: str, r: Report) -> None:
    """More than one gateway may run: they must share one store."""
    kind = store.get('kind', 'memory')
    r.expect(count <= 1 or shares(store), where,
             f'up to {count} gateway replicas ({"; ".join(why)}) with [store] kind = '
             f'"{kind}": each replica would keep tasks of its own, and a caller whose next '
             'call reaches another replica gets "task not found". Share one store ([store] '
             'kind = "redis", or kind = "postgres" with shared = true; docs/store.md) or run '
             'one replica')


def check_k8s(a, r: Report, docker: dict, ctx: dict) -> None:
    versions = k8s_versions()
    since = r.mark()
    trees = kustomize_tree(r)
    files = sorted({f for entries in trees.values() for f in entries if f.is_file()})
    docs = validate_k8s(files, versions, r)
    kv = importlib.metadata.version('kubernetes-validate')
    count = sum(len(d) for d in docs.values())
    r.ok(f'kubernetes: every manifest is listed in its directory\'s kustomization.yaml; {count} '
         f'objects in {len(files)} files validated against Kubernetes {", ".join(versions)} '
         f'(kubernetes-validate {kv}, strict, offline schemas)', since)
    variants = kustomize_variants(trees)
    readme = DEPLOY / 'README.md'
    readme_text = readme.read_text() if readme.is_file() else ''
    ctx['k8s_layouts'] = []
    for d in variants:
        r.expect(f'kubectl apply -k {rel(d)}' in readme_text, readme,
                 f'does not say how to apply {rel(d)} (`kubectl apply -k {rel(d)}`) nor '
                 'when to choose it')
        objs = [(doc, f) for f in kustomize_files(d, trees, r) for doc in docs.get(f, [])]
        names = [(doc.get('kind'), doc.get('metadata', {}).get('name')) for doc, _ in objs]
        dupes = sorted({n for n in names if names.count(n) > 1})
        r.expect(not dupes, d / 'kustomization.yaml', f'renders {dupes} more than once')
        check_kustomize_render(d, objs, r)
        check_k8s_variant(a, r, docker, ctx, d, objs)


def check_k8s_variant(a, r: Report, docker: dict, ctx: dict, variant: Path,
                      objs: list[tuple[dict, Path]]) -> None:
    """One variant as kustomize renders it: the gateway's workload and everything it uses."""
    label = rel(variant)
    since = r.mark()
    by_kind: dict[str, list[tuple[dict, Path]]] = {}
    for doc, f in objs:
        by_kind.setdefault(doc.get('kind'), []).append((doc, f))
        ns = doc.get('metadata', {}).get('namespace')
        r.expect(ns is None, f, f'{doc.get("kind")}/{doc["metadata"].get("name")} sets '
                 f'namespace {ns!r}; leave it to `kubectl apply -n` / kustomize')

    def named(kind: str, name: str) -> list[tuple[dict, Path]]:
        return [(d, f) for d, f in by_kind.get(kind, []) if d['metadata'].get('name') == name]

    workloads = named('Deployment', 'a2a-gateway') + named('StatefulSet', 'a2a-gateway')
    if not r.expect(len(workloads) == 1, label, 'expected one Deployment or StatefulSet named '
                    f'a2a-gateway, found {len(workloads)}'):
        return
    dep, dep_f = workloads[0]
    kind = dep['kind']
    services = {d['metadata']['name']: (d, f) for d, f in by_kind.get('Service', [])}
    svc, svc_f = services.get('a2a-gateway', (None, None))
    r.expect(svc is not None, label, 'no Service a2a-gateway')
    pdbs = by_kind.get('PodDisruptionBudget', [])
    hpas = by_kind.get('HorizontalPodAutoscaler', [])
    secret, secret_f = (named('Secret', 'a2a-gateway-credentials') or [(None, None)])[0]
    r.expect(secret is not None, label, 'no Secret a2a-gateway-credentials')
    sources = {(d['kind'], d['metadata']['name']): (d, f)
               for k in ('ConfigMap', 'Secret') for d, f in by_kind.get(k, [])}
    for (k, name), (obj, f) in sources.items():
        for key in source_data(obj):
            r.expect(bool(CONFIGMAP_KEY.match(key)), f, f'{k} {name}: key {key!r} is not a '
                     'valid key')

    # The pod.
    spec = dep['spec']
    tmpl = spec['template']
    pod = tmpl['spec']
    labels = tmpl['metadata'].get('labels', {})
    where = rel(dep_f)
    r.expect(selector_matches(spec.get('selector'), labels), where,
             'spec.selector does not match the pod template labels')
    replicas = spec.get('replicas', 1)
    containers = [c for c in pod.get('containers', []) if c.get('name') == 'a2a-gateway']
    if not r.expect(len(containers) == 1, where, 'no container named a2a-gateway'):
        return
    c = containers[0]
    ports = {p.get('name'): p for p in c.get('ports', [])}
    http = ports.get('http')
    if r.expect(http is not None, where, 'the container has no port named http'):
        r.expect(http.get('containerPort') == a.port, where,
                 f'containerPort {http.get("containerPort")} (http) is not {a.port}')

    def port_ok(port, what: str) -> None:
        r.expect(port in ('http', a.port), where,
                 f'{what} targets port {port!r}; expected "http" or {a.port}')

    for probe, path in (('livenessProbe', a.health_path), ('readinessProbe', a.ready_path)):
        got, port = probe_target(c.get(probe))
        if r.expect(c.get(probe) is not None, where, f'no {probe}'):
            r.expect(got == path, where, f'{probe} GETs {got!r}, expected {path}')
            port_ok(port, probe)
    if c.get('startupProbe') is not None:
        got, port = probe_target(c['startupProbe'])
        r.expect(got in (a.health_path, a.ready_path), where,
                 f'startupProbe GETs {got!r}, expected {a.health_path} or {a.ready_path}')
        port_ok(port, 'startupProbe')

    # Security.
    psc, csc = pod.get('securityContext', {}), c.get('securityContext', {})

    def sc(key: str):
        return csc.get(key, psc.get(key))

    r.expect(sc('runAsNonRoot') is True, where, 'runAsNonRoot must be true')
    r.expect(sc('runAsUser') == RUN_AS_UID, where,
             f'runAsUser is {sc("runAsUser")!r}, expected {RUN_AS_UID} (the image\'s USER)')
    r.expect(csc.get('readOnlyRootFilesystem') is True, where,
             'readOnlyRootFilesystem must be true')
    r.expect(csc.get('allowPrivilegeEscalation') is False, where,
             'allowPrivilegeEscalation must be false')
    r.expect('ALL' in csc.get('capabilities', {}).get('drop', []), where,
             'capabilities.drop must include ALL')
    r.expect((sc('seccompProfile') or {}).get('type') == 'RuntimeDefault', where,
             'seccompProfile.type must be RuntimeDefault')
    res = c.get('resources', {})
    r.expect(bool(res.get('requests')) and bool(res.get('limits')), where,
             'resources needs requests and limits')

    # Args, env, volumes.
    args = (c.get('command') or []) + (c.get('args') or [])
    flags = serve_paths(args, f'{where} args', r)
    ctx['flag_uses'].append((f'{where} args', set(flags)))
    env = {e['name']: e for e in c.get('env', [])}
    ctx['env_uses'].append((where, set(env)))
    r.expect(env.get('A2A_GATEWAY_HOST', {}).get('value') == '0.0.0.0', where,
             'env A2A_GATEWAY_HOST must be "0.0.0.0"')
    r.expect(env.get('A2A_GATEWAY_LOG_FORMAT', {}).get('value') == 'json', where,
             'env A2A_GATEWAY_LOG_FORMAT must be "json"')
    if 'A2A_GATEWAY_PORT' in env:
        r.expect(env['A2A_GATEWAY_PORT'].get('value') == str(a.port), where,
                 f'env A2A_GATEWAY_PORT is not {a.port}')
    secret_refs = [(n, e['valueFrom']['secretKeyRef']) for n, e in env.items()
                   if 'secretKeyRef' in e.get('valueFrom', {})]
    r.expect(bool(secret_refs), where, 'no credential comes from a Secret (secretKeyRef)')
    for n, ref in secret_refs:
        s = sources.get(('Secret', ref.get('name')))
        if r.expect(s is not None, where, f'env {n} refers to Secret {ref.get("name")!r}, '
                    'which the manifests do not define'):
            r.expect(ref.get('key') in source_data(s[0]), s[1],
                     f'Secret {ref.get("name")} has no key {ref.get("key")!r} (env {n})')
        r.expect(ref.get('optional') is True, where, f'env {n}: secretKeyRef must be '
                 'optional: true (the gateway starts without it)')

    mounts = {m['mountPath'].rstrip('/'): m for m in c.get('volumeMounts', [])}
    volumes = {v['name']: v for v in pod.get('volumes', [])}
    claims = {t['metadata']['name'] for t in spec.get('volumeClaimTemplates', [])} \
        if kind == 'StatefulSet' else set()
    for m in mounts.values():
        r.expect(m['name'] in volumes or m['name'] in claims, where,
                 f'volumeMount {m["name"]} has no volume')
        if volume_source(volumes.get(m['name'], {})):
            r.expect('subPath' not in m, where, f'volumeMount {m["name"]} uses subPath: its '
                     'files would never update on a change of the ConfigMap or Secret')
    for v in volumes.values():
        src = volume_source(v)
        if src:
            r.expect((src[0], src[1]) in sources, where, f'volume {v["name"]} refers to '
                     f'{src[0]} {src[1]!r}, which the manifests do not define')

    def volume_at(path: str):
        m = mounts.get(path.rstrip('/'))
        return volumes.get(m['name']) if m else None

    # gateway.toml, from a ConfigMap or (when it holds a secret, such as the Redis URL) a
    # Secret, mounted as a directory.
    cfg = flags.get('--config')
    cfg_files = None
    cfg_text, cfg_where = None, label
    if cfg:
        d, base = str(PurePosixPath(cfg).parent), PurePosixPath(cfg).name
        v = volume_at(d)
        src = volume_source(v or {})
        if r.expect(src is not None, where, f'--config {cfg}: no ConfigMap or Secret volume is '
                    f'mounted at {d}') and (src[0], src[1]) in sources:
            obj, obj_f = sources[(src[0], src[1])]
            cfg_files = projection(src[2], source_data(obj))
            projected = {p: t for p, t, _ in cfg_files}
            cfg_where = f'{rel(obj_f)} ({src[0]} {src[1]}, gateway.toml)'
            if r.expect(base in projected, where, f'--config {cfg}: {src[0]} {src[1]} does not '
                        f'project {base} there (it projects {sorted(projected)})'):
                cfg_text = projected[base]
    gateway = read_toml(Path(cfg_where), r, cfg_text) if cfg_text is not None else None
    repo_gateway = read_toml(ROOT / 'gateway.toml', r)
    store = (gateway or {}).get('store') or {}
    store_kind = store.get('kind', 'memory')
    if gateway is not None and repo_gateway is not None:
        r.expect(gateway.get('server', {}).get('host') == '0.0.0.0', cfg_where,
                 '[server] host must be "0.0.0.0"')
        port = gateway.get('server', {}).get('port', a.port)
        r.expect(port == a.port, cfg_where, f'sets port {port}, but the manifests use {a.port}')
        # Beyond host, a variant may set [rate_limits] (its load balancer) and a store every
        # replica shares; the rest is the repository's gateway.toml.
        expected = json.loads(json.dumps(repo_gateway))
        expected.setdefault('server', {})['host'] = '0.0.0.0'
        got = json.loads(json.dumps(gateway))
        for key in ('rate_limits',) + (('store',) if shares(store) else ()):
            expected.pop(key, None)
            got.pop(key, None)
        diff = toml_diff(expected, got)
        r.expect(not diff, cfg_where, 'differs from the repository\'s gateway.toml (beyond '
                 '[server] host = "0.0.0.0", [rate_limits] and a shared [store]): '
                 + '; '.join(diff))
        trusted_networks(gateway, cfg_where, r, 'the cluster\'s load balancer')
    grace = shutdown_grace(gateway, a.shutdown_grace_secs)
    tgp = pod.get('terminationGracePeriodSeconds', 30)
    r.expect(tgp > grace, where, f'terminationGracePeriodSeconds {tgp} leaves no room for the '
             f'gateway\'s drain (shutdown_grace_secs {grace:g})')

    ann = tmpl['metadata'].get('annotations', {})
    r.expect(ann.get('prometheus.io/scrape') == 'true', where,
             'pod annotation prometheus.io/scrape must be "true"')
    mport = metrics_port(gateway, a.port, cfg_where, r)
    r.expect(ann.get('prometheus.io/port') == str(mport), where,
             f'pod annotation prometheus.io/port is {ann.get("prometheus.io/port")!r}, '
             f'expected "{mport}"')
    r.expect(ann.get('prometheus.io/path') == a.metrics_path, where,
             f'pod annotation prometheus.io/path is {ann.get("prometheus.io/path")!r}, '
             f'expected {a.metrics_path}')

    # agents.d/: the repository's files, byte for byte.
    agents_dir = flags.get('--agents-dir')
    agents_files = None
    agent_names: set[str] = set()
    if agents_dir:
        v = volume_at(agents_dir)
        src = volume_source(v or {})
        if r.expect(src is not None and src[0] == 'ConfigMap', where, f'--agents-dir '
                    f'{agents_dir}: no ConfigMap volume is mounted there') \
                and ('ConfigMap', src[1]) in sources:
            cm, cm_f = sources[('ConfigMap', src[1])]
            data = cm.get('data') or {}
            repo_agents = ROOT / 'agents.d'
            repo_files = {p.name: p for p in repo_agents.glob('*.toml')}
            repo_scripts = {p.name: p for p in (repo_agents / 'scripts').glob('*') if p.is_file()}
            for name, p in {**repo_files, **repo_scripts}.items():
                if not r.expect(name in data, cm_f, f'ConfigMap {src[1]} lacks {name} '
                                f'(agents.d/{rel(p).split("agents.d/", 1)[1]})'):
                    continue
                r.expect(data[name].encode() == p.read_bytes(), cm_f,
                         f'ConfigMap {src[1]}: {name} is not a byte-for-byte copy of {rel(p)}')
            for key, text in data.items():
                if key.endswith('.toml'):
                    parsed = read_toml(cm_f, r, text)
                    if parsed is not None and 'name' in parsed:
                        agent_names.add(parsed['name'])
                elif key not in repo_scripts:
                    r.fail(cm_f, f'ConfigMap {src[1]}: {key} is neither an agent file nor a '
                           'script of agents.d/scripts/')
            items = src[2].get('items')
            if items:
                keys = [i['key'] for i in items]
                r.expect(sorted(keys) == sorted(data), where,
                         f'volume {v["name"]} items project {sorted(keys)} of ConfigMap '
                         f'{src[1]}, which holds {sorted(data)}: a key left out of items is '
                         'not mounted')
                for i in items:
                    repo = ROOT / 'agents.d' / i['path']
                    if repo.is_file():
                        want = 0o755 if repo.stat().st_mode & stat.S_IXUSR else 0o644
                        got = i.get('mode', src[2].get('defaultMode', 0o644))
                        r.expect(got == want, where, f'{i["path"]} is projected with mode '
                                 f'{got:o}, the repository\'s agents.d/{i["path"]} has {want:o}')
                    else:
                        r.fail(where, f'{i["path"]} projected into {agents_dir} has no '
                               'counterpart in the repository\'s agents.d/')
            agents_files = projection(src[2], data)
    if gateway is not None and agent_names:
        gateway_agent_refs(gateway, agent_names, cfg_where, r)
    if cfg and agents_dir and cfg_files is not None and agents_files is not None:
        ctx['k8s_layouts'].append((label, cfg, agents_dir, cfg_files, agents_files))
    else:
        r.fail(label, 'its configuration cannot be run through `a2a-gateway check`: the '
               'volumes or mounts of --config / --agents-dir are broken (see above)')

    # How many gateways may run, and whether they share their store.
    targeting = []
    for h, f in hpas:
        ref = h['spec'].get('scaleTargetRef', {})
        if r.expect((ref.get('apiVersion'), ref.get('kind'), ref.get('name')) ==
                    ('apps/v1', kind, dep['metadata']['name']), rel(f),
                    f'scaleTargetRef {ref} is not the {kind} {dep["metadata"]["name"]}'):
            targeting.append(h)
    most = max([replicas] + [h['spec'].get('maxReplicas', 1) for h in targeting])
    why = [f'{kind}/{dep["metadata"]["name"]} replicas: {replicas}'] + [
        f'HorizontalPodAutoscaler/{h["metadata"]["name"]} maxReplicas: {h["spec"].get("maxReplicas")}'
        for h in targeting]
    if gateway is not None:
        unshared_replicas(most, why, store, label, r)
    data_dir = None
    if store_kind == 'sqlite':
        data_dir = env.get('A2A_GATEWAY_DATA_DIR', {}).get('value')
        if data_dir is None and cfg:
            data_dir = str(PurePosixPath(cfg).parent / str(store.get('data_dir', './data')))
        m = mounts.get(os.path.normpath(data_dir).rstrip('/')) if data_dir else None
        persistent = m is not None and (m['name'] in claims or 'persistentVolumeClaim'
                                        in volumes.get(m['name'], {}))
        r.expect(persistent, where, f'[store] kind = "sqlite" keeps its database in '
                 f'{data_dir}, which is not on a PersistentVolumeClaim (volumeClaimTemplates '
                 'or a persistentVolumeClaim volume): the tasks would go with the pod')
        r.expect(kind == 'StatefulSet' or spec.get('strategy', {}).get('type') == 'Recreate',
                 where, 'a Deployment\'s rolling update starts the new pod beside the old one, '
                 'which holds the SQLite database: use a StatefulSet, or strategy Recreate')
    if shares(store):
        check_k8s_store(store, services, by_kind, labels, cfg_where, r)

    # Service, PDB, HPA.
    if svc is not None:
        w = rel(svc_f)
        r.expect(svc['spec'].get('type', 'ClusterIP') == 'ClusterIP', w, 'type must be ClusterIP')
        r.expect(selector_matches(svc['spec'].get('selector'), labels), w,
                 f'the selector does not match the {kind}\'s pod labels')
        sports = svc['spec'].get('ports', [])
        r.expect(any(p.get('port') == 80 for p in sports), w, 'no port 80')
        for p in sports:
            tp = p.get('targetPort', p.get('port'))
            r.expect(tp in ('http', a.port), w, f'port {p.get("port")} targets {tp!r}; '
                     f'expected the container port "http" ({a.port})')
    fewest = min([replicas] + [h['spec'].get('minReplicas', 1) for h in targeting])
    for pdb, pdb_f in pdbs:
        w = rel(pdb_f)
        r.expect(selector_matches(pdb['spec'].get('selector'), labels), w,
                 f'the selector does not match the {kind}\'s pod labels')
        r.expect(pdb['spec'].get('minAvailable') == 1, w, 'minAvailable must be 1')
        r.expect(fewest > pdb['spec'].get('minAvailable', 0), w,
                 f'minAvailable {pdb["spec"].get("minAvailable")} with {fewest} replica(s) '
                 'blocks every node drain')
    for hpa in targeting:
        w = label
        lo, hi = hpa['spec'].get('minReplicas', 1), hpa['spec'].get('maxReplicas')
        r.expect((lo, hi) == (2, 10), w, f'HorizontalPodAutoscaler replicas {lo}..{hi}, '
                 'expected 2..10 (deploy/README.md)')
        r.expect(lo <= replicas <= hi, w, f'the {kind}\'s {replicas} replicas are outside the '
                 f'HorizontalPodAutoscaler\'s {lo}..{hi}')
        cpu = [m for m in hpa['spec'].get('metrics', [])
               if m.get('type') == 'Resource' and m['resource'].get('name') == 'cpu']
        if r.expect(bool(cpu), w, 'the HorizontalPodAutoscaler has no CPU metric'):
            util = cpu[0]['resource'].get('target', {}).get('averageUtilization')
            r.expect(util == 70, w, f'CPU target {util}%, expected 70%')
            r.expect('cpu' in res.get('requests', {}), where,
                     'the HPA scales on CPU utilisation, which needs resources.requests.cpu')

    # The same layout as the image: binary and paths.
    if docker.get('agents_dir') and agents_dir:
        r.expect(agents_dir == docker['agents_dir'], where,
                 f'--agents-dir {agents_dir} differs from the image\'s {docker["agents_dir"]}')
    store_text = {'redis': f'Redis at {store.get("url")}', 'sqlite': f'SQLite in {data_dir} on '
                  'a PersistentVolumeClaim',
                  'postgres': f'PostgreSQL{" (shared)" if shares(store) else ""} at '
                  f'{redacted(store.get("url"))}'}.get(store_kind, store_kind)
    r.ok(f'{label}: {kind} of {replicas}{f" to {most}" if most != replicas else ""} '
         f'replica(s), store {store_text}; probes {a.health_path} / {a.ready_path} on port '
         f'http ({a.port}), Service 80 -> http, Prometheus annotations ({a.metrics_path}), '
         '--config/--agents-dir on directory mounts matching the repository\'s gateway.toml '
         'and agents.d/, trusted_proxies set', since)


def redacted(url) -> str:
    """A URL without its password, for messages."""
    u = urlsplit(str(url))
    if u.password is None:
        return str(url)
    return u._replace(netloc=u.netloc.replace(f':{u.password}@', ':***@')).geturl()


def check_k8s_store(store: dict, services: dict, by_kind: dict, gateway_labels: dict,
                    where: str, r: Report) -> None:
    """A shared store's URL naming an in-cluster host: a Service of the manifests, on its
    port, in front of one Redis (or PostgreSQL) the gateway's pods may reach."""
    redis = store.get('kind') == 'redis'
    name, image, default_port = ('Redis', 'redis:', 6379) if redis else \
        ('PostgreSQL', 'postgres:', 5432)
    url = urlsplit(str(store.get('url', 'redis://127.0.0.1:6379')))
    host, port = url.hostname or '', url.port or default_port
    if host in ('localhost', '127.0.0.1', '::1'):
        r.fail(where, f'[store] url {redacted(store.get("url"))} is the pod itself: no {name} '
               'runs there')
        return
    if '.' in host and host not in services:
        return  # a store outside the manifests (a managed one): nothing here to compare
    if not r.expect(host in services, where, f'[store] url {redacted(store.get("url"))} names '
                    f'host {host!r}, which is no Service of the manifests ({sorted(services)})'):
        return
    svc, svc_f = services[host]
    sports = {p.get('port'): p for p in svc['spec'].get('ports', [])}
    r.expect(port in sports, svc_f, f'Service {host} has no port {port} ([store] url '
             f'{redacted(store.get("url"))})')
    pods = [(d, f) for k in ('Deployment', 'StatefulSet') for d, f in by_kind.get(k, [])
            if selector_matches(svc['spec'].get('selector'),
                                d['spec']['template']['metadata'].get('labels', {}))]
    if not r.expect(len(pods) == 1, svc_f, f'Service {host} selects {len(pods)} workloads; '
                    f'expected the one {name}'):
        return
    server, server_f = pods[0]
    rlabels = server['spec']['template']['metadata'].get('labels', {})
    containers = server['spec']['template']['spec'].get('containers', [])
    r.expect(any(str(c.get('image', '')).startswith(image) for c in containers), server_f,
             f'{server["kind"]}/{server["metadata"]["name"]} behind Service {host} runs no '
             f'{image.rstrip(":")} image')
    r.expect(server['spec'].get('replicas', 1) == 1, server_f, f'one {name} pod: several '
             'would each be a separate store')
    target = sports.get(port, {}).get('targetPort', port)
    cports = {p.get('name'): p.get('containerPort') for c in containers
              for p in c.get('ports', [])}
    r.expect(target in cports or target in cports.values(), svc_f,
             f'Service {host} port {port} targets {target!r}, which the {name} container does '
             f'not expose ({cports})')
    for pol, pol_f in by_kind.get('NetworkPolicy', []):
        ps = pol['spec']
        if not selector_matches(ps.get('podSelector'), rlabels) or \
                'Ingress' not in ps.get('policyTypes', ['Ingress']):
            continue
        allowed = any(selector_matches(peer.get('podSelector'), gateway_labels)
                      for rule in ps.get('ingress', []) for peer in rule.get('from', []))
        r.expect(allowed, pol_f, f'NetworkPolicy {pol["metadata"]["name"]} keeps the '
                 f'gateway\'s pods from {name}')


# ---------------------------------------------------------------------------- compose

def compose_port_targets(ports: list, where: str, r: Report) -> list[int]:
    out = []
    for p in ports or []:
        if isinstance(p, dict):
            out.append(int(p.get('target', 0)))
            continue
        text = str(p).split('/')[0]
        try:
            out.append(int(text.rsplit(':', 1)[-1]))
        except ValueError:
            r.fail(where, f'cannot read the port mapping {p!r}')
    return out


def compose_volumes(vols: list, where: str, r: Report) -> list[tuple[str, str, bool]]:
    """(source, target, read_only) of bind mounts."""
    out = []
    for v in vols or []:
        if isinstance(v, dict):
            out.append((v.get('source', ''), v.get('target', ''), bool(v.get('read_only'))))
            continue
        parts = str(v).split(':')
        if len(parts) < 2:
            r.fail(where, f'volume {v!r} mounts nothing from the host')
            continue
        out.append((parts[0], parts[1], len(parts) > 2 and 'ro' in parts[2].split(',')))
    return out


def compose_env(env) -> dict[str, str]:
    if isinstance(env, dict):
        return {k: '' if v is None else str(v) for k, v in env.items()}
    out = {}
    for item in env or []:
        k, _, v = str(item).partition('=')
        out[k] = v
    return out


def as_argv(command) -> list[str]:
    if command is None:
        return []
    return shlex.split(command) if isinstance(command, str) else [str(x) for x in command]


def compose_gateways(path: Path, doc: dict) -> dict[str, dict]:
    """The services of a compose file that run the gateway: built from deploy/Dockerfile, or
    from an a2a-gateway image."""
    out = {}
    for name, svc in ((doc or {}).get('services') or {}).items():
        svc = svc or {}
        b = svc.get('build')
        dockerfile = None
        if isinstance(b, dict):
            dockerfile = (path.parent / b.get('context', '.') / b.get('dockerfile', 'Dockerfile'))
        elif isinstance(b, str):
            dockerfile = path.parent / b / 'Dockerfile'
        image = str(svc.get('image', '')).split('@')[0].rsplit(':', 1)[0].rsplit('/', 1)[-1]
        if (dockerfile is not None and dockerfile.resolve() == DOCKERFILE.resolve()) \
                or image == 'a2a-gateway':
            out[name] = svc
    return out


def compose_gateway_config(path: Path, svc: dict, docker: dict) -> Path | None:
    """The gateway.toml a compose service runs: the file mounted at its --config, or the
    image's own (the repository's gateway.toml)."""
    quiet = Report()  # the service's own checks report its command and mounts
    argv = as_argv(svc.get('command'))
    flags = serve_paths(argv, '', quiet) if argv else (docker.get('flags') or {})
    cfg = flags.get('--config')
    mounts = {t.rstrip('/'): src for src, t, _ in compose_volumes(svc.get('volumes'), '', quiet)}
    if cfg and cfg.rstrip('/') in mounts:
        return (path.parent / mounts[cfg.rstrip('/')]).resolve()
    if cfg and cfg == docker.get('config'):
        return ROOT / 'gateway.toml'
    return None


def check_compose_sharing(path: Path, a, r: Report, docker: dict) -> None:
    """More than one gateway in a compose file (services, or deploy.replicas) must share one
    store: each with a store of its own would keep tasks the others cannot find."""
    where = rel(path)
    since = r.mark()
    try:
        doc = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as e:
        r.fail(where, f'cannot read: {e}')
        return
    gateways = compose_gateways(path, doc)
    total, why, stores = 0, [], {}
    for name, svc in gateways.items():
        n = (svc.get('deploy') or {}).get('replicas', svc.get('scale', 1))
        n = n if isinstance(n, int) else 1
        total += n
        why.append(f'service {name}' + (f' deploy.replicas: {n}' if n != 1 else ''))
        cfg = compose_gateway_config(path, svc, docker)
        if r.expect(cfg is not None and cfg.is_file(), where, f'service {name}: cannot tell '
                    'which gateway.toml it runs (nothing is mounted at its --config)'):
            stores[name] = (cfg, (read_toml(cfg, r) or {}).get('store') or {})
    if total > 1:
        by_file: dict[Path, list[str]] = {}
        for name, (cfg, _) in stores.items():
            by_file.setdefault(cfg, []).append(name)
        for cfg, names in by_file.items():
            unshared_replicas(total, why, stores[names[0]][1],
                              f'{where} (service {", ".join(names)}: {rel(cfg)})', r)
        shared = {(s.get('url', 'redis://127.0.0.1:6379'), s.get('key_prefix', 'a2a:'))
                  for _, s in stores.values() if s.get('kind') == 'redis'}
        r.expect(len(shared) <= 1, where, f'the gateway replicas use different Redis stores '
                 f'(url, key_prefix) {sorted(shared)}: each would keep tasks the others '
                 'cannot find')
        schemas = {(s.get('url'), s.get('schema', 'a2a_gateway'))
                   for _, s in stores.values() if s.get('kind') == 'postgres'}
        r.expect(len(schemas) <= 1, where, f'the gateway replicas use different PostgreSQL '
                 f'schemas {sorted((redacted(u), sc) for u, sc in schemas)}: each would keep '
                 'tasks the others cannot find')
    kinds = sorted({s.get('kind', 'memory') for _, s in stores.values()})
    r.ok(f'{where}: {total} gateway(s) ({", ".join(why) or "none"}), store '
         f'{"/".join(kinds) or "?"}{": shared" if total > 1 else ""}', since)


def check_replicas_compose(a, r: Report, docker: dict, ctx: dict, path: Path, toml: str,
                           store_service: str, scheme: str) -> None:
    """compose.replicas*.yaml: three gateway replicas on one shared store (the compose
    service `store_service`, its URL starting `scheme`) behind nginx, with `toml`."""
    where = rel(path)
    since = r.mark()
    config = DEPLOY / 'compose' / toml
    try:
        doc = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as e:
        r.fail(where, f'cannot read: {e}')
        return
    services = (doc or {}).get('services') or {}
    gateways = [n for n in services if n.startswith('gateway-')]
    r.expect(len(gateways) == 3, where, f'three gateway replicas, found {gateways}')
    for name in (store_service, 'nginx'):
        r.expect(name in services, where, f'no service {name}')
    cfg = read_toml(config, r)
    store = (cfg or {}).get('store') or {}
    # (That it is shared is check_compose_sharing's.)
    host = urlsplit(str(store.get('url', ''))).hostname
    r.expect(str(store.get('url', '')).startswith(scheme) and host == store_service, where,
             f'{toml}: store.url {redacted(store.get("url"))!r} does not name the '
             f'{store_service} service')
    for name in gateways:
        gw = services[name]
        b = gw.get('build') or {}
        r.expect((DEPLOY / b.get('context', '.')).resolve() == ROOT
                 and (ROOT / b.get('dockerfile', '')).resolve() == DOCKERFILE.resolve(),
                 where, f'service {name} does not build deploy/Dockerfile from the root')
        argv = as_argv(gw.get('command'))
        flags = serve_paths(argv, f'{where} {name} command', r) if argv else {}
        ctx['flag_uses'].append((f'{where} {name} command', set(flags)))
        ctx['env_uses'].append((f'{where} ({name})', set(compose_env(gw.get('environment')))))
        mounts = {t: (s, ro) for s, t, ro in compose_volumes(gw.get('volumes'), where, r)}
        src = mounts.get(flags.get('--config', ''))
        r.expect(src is not None and (DEPLOY / src[0]).resolve()
                 == config.resolve() and src[1], where,
                 f'service {name}: --config {flags.get("--config")} is not ./compose/{toml}, read-only')
        r.expect(store_service in (gw.get('depends_on') or {}), where,
                 f'service {name} does not wait for {store_service}')
        port = (cfg or {}).get('server', {}).get('port', a.port)
        r.expect(str(port) in [str(p) for p in gw.get('expose') or []], where,
                 f'service {name} does not expose {port}')
    nginx = services.get('nginx') or {}
    conf_src = next((s for s, t, _ in compose_volumes(nginx.get('volumes'), where, r)
                     if t == '/etc/nginx/nginx.conf'), None)
    conf = (DEPLOY / conf_src).read_text() if conf_src and (DEPLOY / conf_src).is_file() else ''
    upstream = set(re.findall(r'server\s+(gateway-\d+):(\d+)', conf))
    port = (cfg or {}).get('server', {}).get('port', a.port)
    r.expect(upstream == {(n, str(port)) for n in gateways}, where,
             f'nginx.conf upstream {sorted(upstream)} is not every replica on port {port}')
    r.expect('proxy_buffering off' in conf, where, 'nginx.conf must not buffer (SSE streams)')
    conf_where = f'{rel(DEPLOY / conf_src)}' if conf_src else where
    for line in re.findall(r'^\s*proxy_next_upstream\s[^;]*;', conf, re.M):
        r.expect('non_idempotent' not in line, conf_where, f'{line.strip()}: non_idempotent '
                 'passes a POST that reached a replica on to the next one when that replica '
                 'fails, so a send whose replica died after starting its task runs a second '
                 'time on another')
    # nginx's address, as the replicas see it: a subnet of the compose network they share,
    # which trusted_proxies must cover.
    nets = trusted_networks(cfg, rel(config), r, f'nginx ({path.name})')
    networks = nginx.get('networks') or ['default']
    names = list(networks) if isinstance(networks, (list, dict)) else ['default']
    subnets = []
    for net in names:
        ipam = (((doc or {}).get('networks') or {}).get(net) or {}).get('ipam') or {}
        subnets += [c.get('subnet') for c in ipam.get('config') or [] if c.get('subnet')]
    if r.expect(bool(subnets), where, f'nginx\'s network ({", ".join(names)}) has no fixed '
                'subnet (networks.<name>.ipam.config.subnet), so trusted_proxies cannot name '
                'it'):
        for sub in subnets:
            try:
                subnet = ipaddress.ip_network(sub, strict=False)
            except ValueError:
                r.fail(where, f'network subnet {sub!r} is not a network')
                continue
            r.expect(any(subnet.version == n.version and subnet.subnet_of(n) for n in nets),
                     rel(config), f'[rate_limits] '
                     f'trusted_proxies {[str(n) for n in nets]} does not cover nginx\'s network '
                     f'{subnet}: every anonymous caller would share nginx\'s one allowance')
    r.ok(f'{where}: {len(gateways)} replicas with [store] kind = "{store.get("kind")}" at the '
         f'{store_service} service, '
         'nginx upstream over all of them, unbuffered, no retry of a sent POST, trusted_proxies '
         'covering nginx\'s network', since)


def check_compose(a, r: Report, docker: dict, ignore: DockerIgnore, ctx: dict) -> None:
    where = rel(COMPOSE)
    since = r.mark()
    if not r.expect(COMPOSE.is_file(), where, 'missing'):
        return
    try:
        doc = yaml.safe_load(COMPOSE.read_text())
    except yaml.YAMLError as e:
        r.fail(where, f'not valid YAML: {e}')
        return
    services = (doc or {}).get('services') or {}
    for name in ('gateway', 'agent-a', 'agent-b', 'prometheus'):
        r.expect(name in services, where, f'no service {name}')

    def build_of(name: str) -> Path | None:
        b = services.get(name, {}).get('build')
        if not r.expect(isinstance(b, dict), where, f'service {name}: build must name a '
                        'context and a dockerfile'):
            return None
        context = (DEPLOY / b.get('context', '.')).resolve()
        r.expect(context == ROOT, where, f'service {name}: build context {b.get("context")} '
                 f'is {rel(context)}, not the repository root')
        dockerfile = (context / b.get('dockerfile', 'Dockerfile')).resolve()
        r.expect(dockerfile.is_file(), where, f'service {name}: dockerfile '
                 f'{b.get("dockerfile")} does not exist')
        return dockerfile

    gw = services.get('gateway')
    compose_cfg = None
    if gw:
        dockerfile = build_of('gateway')
        r.expect(dockerfile == DOCKERFILE.resolve(), where,
                 f'service gateway builds {rel(dockerfile) if dockerfile else None}, not '
                 'deploy/Dockerfile')
        targets = compose_port_targets(gw.get('ports'), where, r)
        r.expect(a.port in targets, where, f'service gateway publishes container ports '
                 f'{targets}, none is {a.port}')
        env = compose_env(gw.get('environment'))
        ctx['env_uses'].append((f'{where} (gateway)', set(env)))
        if 'A2A_GATEWAY_PORT' in env:
            r.expect(env['A2A_GATEWAY_PORT'] == str(a.port), where,
                     f'A2A_GATEWAY_PORT={env["A2A_GATEWAY_PORT"]} is not {a.port}')
        entry = as_argv(gw.get('entrypoint')) or [docker.get('bin')]
        r.expect(entry == [docker.get('bin')], where, f'service gateway: entrypoint {entry} '
                 f'is not the image\'s {docker.get("bin")}')
        argv = as_argv(gw.get('command'))
        if argv:
            flags = serve_paths(argv, f'{where} gateway command', r)
            ctx['flag_uses'].append((f'{where} gateway command', set(flags)))
        else:
            flags = docker.get('flags') or {}
        cfg_path, agents_path = flags.get('--config'), flags.get('--agents-dir')
        mounts = compose_volumes(gw.get('volumes'), where, r)
        by_target = {t.rstrip('/'): (s, ro) for s, t, ro in mounts}
        for src, tgt, ro in mounts:
            if src.startswith(('.', '/')):
                path = (DEPLOY / src).resolve()
                r.expect(path.exists(), where, f'service gateway mounts {src} ({rel(path)}), '
                         'which does not exist')
            r.expect(ro, where, f'service gateway mounts {tgt} read-write; the gateway only '
                     'reads its configuration (add :ro)')
        cfg_src = by_target.get((cfg_path or '').rstrip('/'))
        if r.expect(cfg_src is not None, where, f'service gateway: nothing is mounted at the '
                    f'--config path {cfg_path}'):
            path = (DEPLOY / cfg_src[0]).resolve()
            r.expect(path == (DEPLOY / 'compose' / 'gateway.toml').resolve(), where,
                     f'{cfg_path} comes from {cfg_src[0]}, expected ./compose/gateway.toml')
        agents_src = by_target.get((agents_path or '').rstrip('/'))
        if r.expect(agents_src is not None, where, f'service gateway: nothing is mounted at '
                    f'the --agents-dir path {agents_path}'):
            path = (DEPLOY / agents_src[0]).resolve()
            r.expect(path == (DEPLOY / 'compose' / 'agents.d').resolve(), where,
                     f'{agents_path} comes from {agents_src[0]}, expected ./compose/agents.d')
        compose_cfg = read_toml(DEPLOY / 'compose' / 'gateway.toml', r)
        grace = shutdown_grace(compose_cfg, a.shutdown_grace_secs)
        sgp = duration_secs(gw.get('stop_grace_period', '10s'), where, r)
        if sgp is not None:
            r.expect(sgp > grace, where, f'service gateway: stop_grace_period {sgp:g}s leaves '
                     f'no room for the drain (shutdown_grace_secs {grace:g})')
        r.expect(gw.get('stop_signal', 'SIGTERM') == 'SIGTERM', where,
                 'service gateway: stop_signal must be SIGTERM')
        r.expect(not (gw.get('healthcheck') or {}).get('disable'), where,
                 'service gateway disables the image\'s HEALTHCHECK')

    # Agent services: name -> listening port.
    agent_ports: dict[str, int] = {}
    for name in ('agent-a', 'agent-b'):
        svc = services.get(name)
        if not svc:
            continue
        dockerfile = build_of(name)
        if dockerfile and dockerfile.is_file():
            instrs = dockerfile_instructions(dockerfile)
            froms = [args for w, args, _ in instrs if w == 'FROM']
            r.expect(froms[-1:] == ['python:3.11-slim'], dockerfile,
                     f'must build FROM python:3.11-slim, got {froms}')
            copies = [parse_copy(args) for w, args, _ in instrs if w == 'COPY']
            srcs = {s for c in copies for s in c['sources']}
            for needed in ('tests/interop/requirements.txt',
                           'tests/interop/echo_reference_agent.py'):
                r.expect(needed in srcs, dockerfile, f'does not COPY {needed}')
            check_copy_sources(dockerfile, copies, ignore, r)
        argv = as_argv(svc.get('command'))
        flags = dict(zip(argv[::2], argv[1::2])) if len(argv) % 2 == 0 else {}
        if r.expect('--port' in flags, where, f'service {name}: the command must give --port '
                    f'(echo_reference_agent.py requires it): {argv}'):
            agent_ports[name] = int(flags['--port'])
        r.expect(flags.get('--host') == '0.0.0.0', where, f'service {name}: --host must be '
                 '0.0.0.0 (its default 127.0.0.1 is unreachable from the gateway)')
        if '--public-url' in flags and name in agent_ports:
            u = urlsplit(flags['--public-url'])
            r.expect((u.hostname, u.port) == (name, agent_ports[name]), where,
                     f'service {name}: --public-url {flags["--public-url"]} is not '
                     f'http://{name}:{agent_ports[name]}/')
        r.expect(bool(svc.get('healthcheck')), where, f'service {name} has no healthcheck '
                 '(the gateway waits for it)')

    # Agent files: upstream A2A agents at those services.
    agents_dir = DEPLOY / 'compose' / 'agents.d'
    names: set[str] = set()
    urls = {}
    for f in sorted(agents_dir.glob('*.toml')):
        check_schema_line(f, 'agent.schema.json', r)
        agent = read_toml(f, r)
        if agent is None:
            continue
        names.add(agent.get('name'))
        backend = agent.get('backend', {})
        if backend.get('kind') != 'a2a':
            continue
        u = urlsplit(backend.get('url', ''))
        urls[f.name] = backend.get('url')
        host, port = u.hostname, u.port or (443 if u.scheme == 'https' else 80)
        try:
            ip = ipaddress.ip_address(host or '')
            r.expect(not ip.is_link_local, f, f'url {backend.get("url")} is link-local')
        except ValueError:
            pass
        if r.expect(host in agent_ports, f, f'url {backend.get("url")} names host {host!r}, '
                    f'which is none of the agent services {sorted(agent_ports)}'):
            r.expect(port == agent_ports[host], f, f'url {backend.get("url")} uses port '
                     f'{port}, but service {host} listens on {agent_ports[host]}')
    r.expect(set(urls.values()) and len(set(urls.values())) == len(urls) and
             {urlsplit(u).hostname for u in urls.values()} == {'agent-a', 'agent-b'},
             agents_dir, f'expected one upstream agent file for each of agent-a and agent-b, '
             f'got {urls}')
    cfg_path = DEPLOY / 'compose' / 'gateway.toml'
    if cfg_path.is_file():
        check_schema_line(cfg_path, 'gateway.schema.json', r)
    if compose_cfg is not None:
        server = compose_cfg.get('server', {})
        r.expect(server.get('host') == '0.0.0.0', cfg_path, '[server] host must be "0.0.0.0"')
        r.expect(server.get('port', a.port) == a.port, cfg_path,
                 f'[server] port {server.get("port")} is not {a.port}')
        gateway_agent_refs(compose_cfg, names, rel(cfg_path), r)

    # Prometheus.
    prom = services.get('prometheus')
    if prom:
        r.expect(str(prom.get('image', '')).startswith('prom/prometheus'), where,
                 f'service prometheus: image {prom.get("image")!r} is not prom/prometheus')
        mounts = compose_volumes(prom.get('volumes'), where, r)
        cfgs = [s for s, t, _ in mounts if t == '/etc/prometheus/prometheus.yml']
        if r.expect(bool(cfgs), where, 'service prometheus mounts nothing at '
                    '/etc/prometheus/prometheus.yml'):
            pfile = (DEPLOY / cfgs[0]).resolve()
            if r.expect(pfile.is_file(), where, f'{cfgs[0]} does not exist'):
                try:
                    pconf = yaml.safe_load(pfile.read_text()) or {}
                except yaml.YAMLError as e:
                    r.fail(pfile, f'not valid YAML: {e}')
                    pconf = {}
                mport = metrics_port(compose_cfg, a.port, rel(cfg_path), r)
                jobs = [j for j in pconf.get('scrape_configs', [])
                        if any(f'gateway:{mport}' in sc.get('targets', [])
                               for sc in j.get('static_configs', []))]
                if r.expect(bool(jobs), pfile, f'no scrape job targets gateway:{mport}'):
                    path = jobs[0].get('metrics_path', '/metrics')
                    r.expect(path == a.metrics_path, pfile,
                             f'the gateway job scrapes {path}, expected {a.metrics_path}')
    r.ok(f'compose.yaml (PyYAML): services gateway/agent-a/agent-b/prometheus, {a.port} '
         f'published, mounts exist, upstream agent files at the agent services, Prometheus '
         f'scrapes gateway:{a.port}{a.metrics_path}', since)

    # docker compose itself, when installed.
    docker_bin = shutil.which('docker')
    plugin = None
    if docker_bin:
        try:
            plugin = subprocess.run([docker_bin, 'compose', 'version'], capture_output=True,
                                    text=True, timeout=30)
        except subprocess.TimeoutExpired:
            plugin = None
    if plugin is not None and plugin.returncode == 0:
        res = subprocess.run([docker_bin, 'compose', '-f', str(COMPOSE), 'config', '-q'],
                             capture_output=True, text=True, timeout=60, cwd=ROOT)
        if r.expect(res.returncode == 0, where, f'`docker compose config -q` failed: '
                    f'{(res.stderr or res.stdout).strip()}'):
            r.ok('compose.yaml: `docker compose config -q` accepts it')
    else:
        print('deploy-check: note: the docker compose plugin is not installed here; '
              'compose.yaml was checked with PyYAML only (no `docker compose config`)')
        r.skipped('compose.yaml: `docker compose config` NOT run (no compose plugin)')


# ---------------------------------------------------------------------------- systemd

def read_unit(path: Path) -> dict[str, dict[str, list[str]]]:
    sections: dict[str, dict[str, list[str]]] = {}
    current = None
    for line in path.read_text().splitlines():
        line = line.strip()
        if not line or line.startswith(('#', ';')):
            continue
        if line.startswith('[') and line.endswith(']'):
            current = sections.setdefault(line[1:-1], {})
            continue
        k, _, v = line.partition('=')
        if current is not None:
            current.setdefault(k.strip(), []).append(v.strip())
    return sections


def check_systemd(a, r: Report, docker: dict, ctx: dict) -> None:
    where = rel(UNIT)
    since = r.mark()
    if not r.expect(UNIT.is_file(), where, 'missing'):
        return
    svc = read_unit(UNIT).get('Service', {})

    def one(key: str) -> str | None:
        vals = svc.get(key)
        return vals[-1] if vals else None

    start = shlex.split(one('ExecStart') or '')
    if r.expect(bool(start), where, 'no ExecStart'):
        r.expect(start[0] == docker.get('bin', '/usr/local/bin/a2a-gateway'), where,
                 f'ExecStart runs {start[0]}, the image installs {docker.get("bin")}')
        flags = serve_paths(start[1:], f'{where} ExecStart', r)
        ctx['flag_uses'].append((f'{where} ExecStart', set(flags)))
        for flag, key in (('--config', 'config'), ('--agents-dir', 'agents_dir')):
            if docker.get(key):
                r.expect(flags.get(flag) == docker[key], where,
                         f'ExecStart {flag} {flags.get(flag)} differs from the image\'s '
                         f'{docker[key]} (deploy/README.md installs the files there)')
    env = {}
    for e in svc.get('Environment', []):
        for w in shlex.split(e):
            k, _, v = w.partition('=')
            env[k] = v
    ctx['env_uses'].append((where, set(env)))
    r.expect(env.get('A2A_GATEWAY_LOG_FORMAT') == 'json', where,
             'Environment=A2A_GATEWAY_LOG_FORMAT=json is missing')
    if 'A2A_GATEWAY_PORT' in env:
        r.expect(env['A2A_GATEWAY_PORT'] == str(a.port), where,
                 f'A2A_GATEWAY_PORT is not {a.port}')
    reload_ = one('ExecReload') or ''
    r.expect(bool(re.fullmatch(r'\S*kill\s+-(?:HUP|SIGHUP|s\s+HUP)\s+\$MAINPID', reload_)),
             where, f'ExecReload must send SIGHUP to $MAINPID, got {reload_!r}')
    r.expect(one('KillSignal') in (None, 'SIGTERM'), where,
             f'KillSignal must be SIGTERM, got {one("KillSignal")}')
    r.expect(one('KillMode') == 'mixed', where, 'KillMode must be mixed: SIGTERM to the '
             'gateway alone (it ends its command agents\' processes itself), SIGKILL to all '
             'at the timeout')
    stop = duration_secs(one('TimeoutStopSec') or '90s', where, r)
    if stop is not None:
        r.expect(stop > a.shutdown_grace_secs, where, f'TimeoutStopSec {stop:g}s leaves no '
                 f'room for the drain (shutdown_grace_secs {a.shutdown_grace_secs:g})')
    expected = {
        'Type': {'simple', 'exec'}, 'Restart': {'on-failure'}, 'LimitNOFILE': {'65536'},
        'NoNewPrivileges': {'yes', 'true'}, 'ProtectSystem': {'strict'},
        'ProtectHome': {'yes', 'true'}, 'PrivateTmp': {'yes', 'true'},
        'PrivateDevices': {'yes', 'true'}, 'ProtectKernelTunables': {'yes', 'true'},
        'ProtectKernelModules': {'yes', 'true'}, 'ProtectKernelLogs': {'yes', 'true'},
        'ProtectControlGroups': {'yes', 'true'}, 'RestrictNamespaces': {'yes', 'true'},
        'LockPersonality': {'yes', 'true'}, 'MemoryDenyWriteExecute': {'yes', 'true'},
        'RestrictRealtime': {'yes', 'true'}, 'SystemCallArchitectures': {'native'},
        'CapabilityBoundingSet': {''}, 'StateDirectory': {'a2a-gateway'},
    }
    for key, allowed in expected.items():
        want = ' or '.join(sorted(allowed)) or 'empty'
        r.expect(one(key) in allowed, where, f'{key}= must be {want}, got {one(key)!r}')
    fams = set((one('RestrictAddressFamilies') or '').split())
    r.expect(fams == {'AF_INET', 'AF_INET6', 'AF_UNIX'}, where,
             f'RestrictAddressFamilies must be AF_INET AF_INET6 AF_UNIX, got {sorted(fams)}')
    r.expect(one('DynamicUser') in ('yes', 'true') or one('User') == 'a2a-gateway', where,
             'the service must run as a2a-gateway (User=) or a dynamic user')
    r.ok('systemd unit: ExecStart paths as in the image, ExecReload = SIGHUP, SIGTERM within '
         f'TimeoutStopSec={one("TimeoutStopSec")}, KillMode=mixed, sandbox settings', since)

    analyze = shutil.which('systemd-analyze')
    if analyze:
        # verify wants ExecStart's program to exist: point it at a stub.
        with tempfile.TemporaryDirectory() as tmp:
            stub = Path(tmp) / 'a2a-gateway'
            stub.write_text('#!/bin/sh\n')
            stub.chmod(0o755)
            unit = Path(tmp) / UNIT.name
            program = start[0] if start else '/usr/local/bin/a2a-gateway'
            unit.write_text(UNIT.read_text().replace(program, str(stub)))
            res = subprocess.run([analyze, 'verify', str(unit)], capture_output=True,
                                 text=True, timeout=60)
            out = (res.stdout + res.stderr).strip()
            if r.expect(res.returncode == 0 and not out, where,
                        f'systemd-analyze verify: {out or "exit " + str(res.returncode)}'):
                r.ok('systemd unit: `systemd-analyze verify` reports nothing')
    else:
        print('deploy-check: note: systemd-analyze not installed; the unit was checked by '
              'parsing only')
        r.skipped('systemd unit: `systemd-analyze verify` NOT run (not installed)')


# ---------------------------------------------------------------------------- the binary

def schema_props(root: dict, node: dict) -> dict:
    """The properties of a schema node, through $ref / allOf / anyOf wrappers."""
    for _ in range(10):
        if 'properties' in node:
            return node['properties']
        ref = node.get('$ref') or next(
            (x.get('$ref') for x in node.get('allOf', []) + node.get('anyOf', [])
             if isinstance(x, dict) and x.get('$ref')), None)
        if not ref or not ref.startswith('#/'):
            return {}
        node = root
        for part in ref[2:].split('/'):
            node = node.get(part, {})
    return {}


def check_with_binary(a, r: Report, ctx: dict) -> None:
    binary = Path(a.gateway_bin).resolve()
    if not r.expect(binary.is_file() and os.access(binary, os.X_OK), str(binary),
                    'the --gateway-bin is not an executable file'):
        return

    def run(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess:
        return subprocess.run([str(binary), *args], capture_output=True, text=True,
                              timeout=60, cwd=cwd)

    help_ = run('serve', '--help')
    if not r.expect(help_.returncode == 0, 'a2a-gateway serve --help', help_.stderr.strip()):
        return
    flags = set(re.findall(r'(?<![\w-])(--[a-z][a-z0-9-]*)', help_.stdout))
    # clap prints [env: NAME=value], or [env: NAME] for hide_env_values.
    envs = set(re.findall(r'\[env: (A2A_GATEWAY_[A-Z0-9_]+)[=\]]', help_.stdout))
    envs |= ENV_OUTSIDE_CLAP
    for where, used in ctx['flag_uses']:
        unknown = sorted(used - flags)
        r.expect(not unknown, where, f'{unknown}: not flags of `a2a-gateway serve` '
                 f'({sorted(flags)})')
    for where, used in ctx['env_uses']:
        unknown = sorted(v for v in used if v.startswith('A2A_GATEWAY_') and v not in envs)
        r.expect(not unknown, where, f'{unknown}: not variables the gateway reads '
                 f'({sorted(envs)})')

    schema = run('schema', 'gateway')
    if r.expect(schema.returncode == 0, 'a2a-gateway schema gateway', schema.stderr.strip()):
        s = json.loads(schema.stdout)
        props = schema_props(s, s.get('properties', {}).get('server', {}))
        port = props.get('port', {}).get('default')
        r.expect(port == a.port, 'a2a-gateway schema gateway',
                 f'server.port defaults to {port}, but the check was run for {a.port}')
        grace = props.get('shutdown_grace_secs', {}).get('default')
        if grace is not None:
            r.expect(grace == a.shutdown_grace_secs, 'a2a-gateway schema gateway',
                     f'server.shutdown_grace_secs defaults to {grace}, but the check was run '
                     f'for {a.shutdown_grace_secs:g}')

    def check(label: str, config: Path, agents: Path, cwd: Path) -> None:
        res = run('check', '--config', str(config), '--agents-dir', str(agents), cwd=cwd)
        if r.expect(res.returncode == 0, label, f'`a2a-gateway check` refuses it:\n'
                    f'{(res.stderr or res.stdout).strip()}'):
            r.ok(f'a2a-gateway check: {label}: {res.stdout.strip()}')

    check('the image\'s configuration (gateway.toml, agents.d/)', ROOT / 'gateway.toml',
          ROOT / 'agents.d', ROOT)
    check('deploy/compose', DEPLOY / 'compose' / 'gateway.toml',
          DEPLOY / 'compose' / 'agents.d', DEPLOY / 'compose')
    check('deploy/compose.replicas.yaml (the image\'s agents.d/)',
          DEPLOY / 'compose' / 'replicas.toml', ROOT / 'agents.d', DEPLOY / 'compose')
    check('deploy/compose.replicas-postgres.yaml (the image\'s agents.d/)',
          DEPLOY / 'compose' / 'replicas-postgres.toml', ROOT / 'agents.d', DEPLOY / 'compose')
    # Each Kubernetes variant's configuration as the kubelet projects it.
    for label, cfg, agents_dir, cfg_files, agents_files in ctx.get('k8s_layouts', []):
        with tempfile.TemporaryDirectory() as tmp:
            base = Path(tmp)
            cfg_dir = base / PurePosixPath(cfg).parent.relative_to('/')
            agents_path = base / PurePosixPath(agents_dir).relative_to('/')
            materialise(cfg_files, cfg_dir)
            materialise(agents_files, agents_path)
            check(f'{label} as mounted', cfg_dir / PurePosixPath(cfg).name, agents_path, base)


# ---------------------------------------------------------------------------- main

def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument('--port', type=int, required=True, help="the gateway's default port")
    p.add_argument('--health-path', required=True, help='liveness endpoint, e.g. /a2a/health')
    p.add_argument('--ready-path', required=True, help='readiness endpoint, e.g. /a2a/ready')
    p.add_argument('--metrics-path', required=True, help='Prometheus endpoint, e.g. /metrics')
    p.add_argument('--shutdown-grace-secs', type=float, default=20,
                   help='server.shutdown_grace_secs default (20)')
    p.add_argument('--gateway-bin', help='the a2a-gateway binary: also run `check` on every '
                   'configuration and compare flags, variables and defaults with it')
    p.add_argument('--live-port', type=int, help='a running gateway on 127.0.0.1: the '
                   'Dockerfile HEALTHCHECK must pass against it')
    p.add_argument('--root', help='the repository to check (default: the one holding this '
                   'script)')
    a = p.parse_args()
    if a.root:
        set_root(Path(a.root))
    for name in ('health_path', 'ready_path', 'metrics_path'):
        if not getattr(a, name).startswith('/'):
            p.error(f'--{name.replace("_", "-")} must start with /')

    r = Report()
    ctx: dict = {'flag_uses': [], 'env_uses': []}
    ignore = DockerIgnore(DOCKERIGNORE)
    if r.expect(DOCKERIGNORE.is_file(), '.dockerignore', 'missing at the repository root'):
        for path in ('target/release/a2a-gateway', '.git/HEAD', 'fuzz/target/x',
                     'fuzz/Cargo.toml', 'tests/interop/js/node_modules/x/index.js'):
            r.expect(ignore.excluded(path), '.dockerignore', f'{path} is not excluded')
    docker = check_dockerfile(a, r, ignore)
    ctx['flag_uses'].append(('deploy/Dockerfile CMD', set(docker.get('flags') or {})))
    ctx['env_uses'].append(('deploy/Dockerfile', set(docker.get('env') or {})))
    check_healthcheck_behaviour(a, docker, r)
    check_k8s(a, r, docker, ctx)
    check_compose(a, r, docker, ignore, ctx)
    check_replicas_compose(a, r, docker, ctx, REPLICAS, 'replicas.toml', 'redis', 'redis://')
    check_replicas_compose(a, r, docker, ctx, REPLICAS_PG, 'replicas-postgres.toml', 'postgres',
                           'postgres://')
    for path in (COMPOSE, REPLICAS, REPLICAS_PG):
        check_compose_sharing(path, a, r, docker)
    check_systemd(a, r, docker, ctx)
    if a.gateway_bin:
        check_with_binary(a, r, ctx)
    else:
        for where, used in ctx['flag_uses']:
            for f in sorted(used - KNOWN_FLAGS_FALLBACK):
                r.fail(where, f'{f} is not a flag of `a2a-gateway serve`')
        for where, used in ctx['env_uses']:
            for v in sorted(used):
                if v.startswith('A2A_GATEWAY_') and v not in KNOWN_ENV_FALLBACK:
                    r.fail(where, f'{v} is not a variable the gateway reads')
        r.skipped('no --gateway-bin: configurations NOT run through `a2a-gateway check`; '
                  'flags and variables compared with a built-in list')

    print(f'deploy-check: defaults: port {a.port}, health {a.health_path}, ready '
          f'{a.ready_path}, metrics {a.metrics_path}, shutdown grace '
          f'{a.shutdown_grace_secs:g}s')
    for line in r.done:
        print(f'  {line}')
    if r.problems:
        print(f'deploy-check: FAILED, {len(r.problems)} problem(s):', file=sys.stderr)
        for line in r.problems:
            print(f'  - {line}', file=sys.stderr)
        return 1
    print('deploy-check: all checks passed')
    return 0


if __name__ == '__main__':
    sys.exit(main())
