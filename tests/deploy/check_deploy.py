#!/usr/bin/env python3
"""Offline checks of deploy/: every file is valid on its own terms, and all of them agree
with each other and with the gateway's own defaults.

    check_deploy.py --port 8080 --health-path /a2a/health --ready-path /a2a/ready \\
        --metrics-path /metrics [--gateway-bin PATH] [--live-port N]

Run through scripts/deploy-check.sh, which installs kubernetes-validate and PyYAML.

- Kubernetes (deploy/kubernetes): kustomization.yaml lists every manifest and only existing
  ones; each object validates against the Kubernetes JSON schemas bundled with
  kubernetes-validate (strict: unknown fields fail), offline; selectors, ports, probes,
  Prometheus annotations, the Secret reference, the volumes and mount paths, the args'
  config paths, the security context and the grace period agree; the ConfigMaps hold the
  repository's gateway.toml (host 0.0.0.0) and agents.d/ files byte for byte.
- Dockerfile: EXPOSE, HEALTHCHECK (run here against stub servers: 200 on the ready path
  passes; 503, a wrong path or a closed port fail), CMD paths against COPY destinations,
  the non-root user; nothing it COPYs is excluded by .dockerignore.
- compose.yaml: services, port mapping, mounted files, upstream agent files pointing at
  compose services on the ports they listen on, the Prometheus scrape target and path; and
  `docker compose config -q` when the compose plugin is installed.
- systemd unit: ExecStart paths, reload by SIGHUP, stop by SIGTERM within TimeoutStopSec,
  the sandbox; `systemd-analyze verify` when installed.
- With --gateway-bin: `a2a-gateway check` accepts the image's, the compose and the
  Kubernetes configuration (materialised as the kubelet projects it); every flag and
  A2A_GATEWAY_* variable used is one the binary knows; the schema's server.port default is
  --port. With --live-port: the Dockerfile HEALTHCHECK passes against a running gateway.

Prints what was checked and every problem found, precisely; exit status 1 on any problem.
"""

from __future__ import annotations

import argparse
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

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / 'deploy'
K8S = DEPLOY / 'kubernetes'
DOCKERFILE = DEPLOY / 'Dockerfile'
COMPOSE = DEPLOY / 'compose.yaml'
UNIT = DEPLOY / 'systemd' / 'a2a-gateway.service'
DOCKERIGNORE = ROOT / '.dockerignore'

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


def load_kustomization(r: Report) -> list[Path]:
    path = K8S / 'kustomization.yaml'
    if not r.expect(path.is_file(), path, 'missing'):
        return []
    try:
        k = yaml.safe_load(path.read_text())
    except yaml.YAMLError as e:
        r.fail(path, f'not valid YAML: {e}')
        return []
    r.expect(k.get('apiVersion') == 'kustomize.config.k8s.io/v1beta1', path,
             f'apiVersion must be kustomize.config.k8s.io/v1beta1, got {k.get("apiVersion")!r}')
    r.expect(k.get('kind') == 'Kustomization', path,
             f'kind must be Kustomization, got {k.get("kind")!r}')
    listed = k.get('resources') or []
    files = []
    for name in listed:
        p = K8S / name
        if r.expect(p.is_file(), path, f'resources lists {name}, which does not exist'):
            files.append(p)
    dupes = {n for n in listed if listed.count(n) > 1}
    r.expect(not dupes, path, f'resources lists {sorted(dupes)} more than once')
    present = {p.name for p in K8S.iterdir()
               if p.suffix in ('.yaml', '.yml') and p.name != 'kustomization.yaml'}
    missing = sorted(present - set(listed))
    r.expect(not missing, path, f'{missing} not listed in resources (kubectl apply -k would '
             'leave them out)')
    return files


def validate_k8s(files: list[Path], versions: list[str], r: Report) -> list[tuple[dict, Path]]:
    objs = []
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
            objs.append((doc, f))
    return objs


def selector_matches(selector: dict | None, labels: dict) -> bool:
    match = (selector or {}).get('matchLabels', selector or {})
    return bool(match) and all(labels.get(k) == v for k, v in match.items())


def probe_target(probe: dict | None) -> tuple[str | None, object]:
    http = (probe or {}).get('httpGet') or {}
    return http.get('path'), http.get('port')


def materialise_agents_volume(cm: dict, volume: dict, dest: Path) -> None:
    """Writes a ConfigMap volume as the kubelet projects it (items, modes)."""
    data = cm.get('data') or {}
    default_mode = volume.get('defaultMode', 0o644)
    items = volume.get('items')
    pairs = ([(i['key'], i['path'], i.get('mode', default_mode)) for i in items]
             if items else [(k, k, default_mode) for k in data])
    for key, path, mode in pairs:
        target = dest / path
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(data[key])
        target.chmod(mode)


def check_kustomize_render(objs: list[tuple[dict, Path]], r: Report) -> None:
    """`kubectl kustomize` (offline) renders exactly the objects validated here."""
    kubectl = shutil.which('kubectl')
    if not kubectl:
        r.skipped('kubernetes: `kubectl kustomize` NOT run (kubectl not installed)')
        return
    where = rel(K8S / 'kustomization.yaml')
    try:
        res = subprocess.run([kubectl, 'kustomize', str(K8S)], capture_output=True, text=True,
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
        r.ok(f'kubernetes: `kubectl kustomize` renders the same {len(rendered)} objects')


def check_k8s(a, r: Report, docker: dict, ctx: dict) -> None:
    versions = k8s_versions()
    since = r.mark()
    files = load_kustomization(r)
    objs = validate_k8s(files, versions, r)
    kv = importlib.metadata.version('kubernetes-validate')
    r.ok(f'kubernetes: kustomization.yaml lists every manifest; {len(objs)} objects in '
         f'{len(files)} files validated against Kubernetes {", ".join(versions)} '
         f'(kubernetes-validate {kv}, strict, offline schemas)', since)
    check_kustomize_render(objs, r)
    since = r.mark()

    by_kind: dict[str, list[tuple[dict, Path]]] = {}
    for doc, f in objs:
        by_kind.setdefault(doc.get('kind'), []).append((doc, f))
        ns = doc.get('metadata', {}).get('namespace')
        r.expect(ns is None, f, f'{doc.get("kind")}/{doc["metadata"].get("name")} sets '
                 f'namespace {ns!r}; leave it to `kubectl apply -n` / kustomize')

    def one(kind: str, name: str | None = None):
        found = [(d, f) for d, f in by_kind.get(kind, [])
                 if name is None or d['metadata'].get('name') == name]
        r.expect(len(found) == 1, 'deploy/kubernetes',
                 f'expected one {kind}{" " + name if name else ""}, found {len(found)}')
        return found[0] if len(found) == 1 else (None, None)

    dep, dep_f = one('Deployment', 'a2a-gateway')
    svc, svc_f = one('Service')
    pdb, pdb_f = one('PodDisruptionBudget')
    hpa, hpa_f = one('HorizontalPodAutoscaler')
    secret, secret_f = one('Secret', 'a2a-gateway-credentials')
    cm_cfg, cm_f = one('ConfigMap', 'a2a-gateway-config')
    cm_agents, _ = one('ConfigMap', 'a2a-gateway-agents')
    configmaps = {d['metadata']['name']: d for d, _ in by_kind.get('ConfigMap', [])}
    secrets = {d['metadata']['name']: d for d, _ in by_kind.get('Secret', [])}
    if dep is None:
        return

    # ConfigMap contents against the repository's files.
    for name, cm in configmaps.items():
        for key in (cm.get('data') or {}):
            r.expect(bool(CONFIGMAP_KEY.match(key)), cm_f, f'ConfigMap {name}: key {key!r} '
                     'is not a valid ConfigMap key')
    cm_gateway = None
    if cm_cfg is not None:
        text = (cm_cfg.get('data') or {}).get('gateway.toml')
        if r.expect(text is not None, cm_f, 'ConfigMap a2a-gateway-config has no gateway.toml'):
            cm_gateway = read_toml(cm_f, r, text)
    repo_gateway = read_toml(ROOT / 'gateway.toml', r)
    if cm_gateway is not None and repo_gateway is not None:
        r.expect(cm_gateway.get('server', {}).get('host') == '0.0.0.0', cm_f,
                 'gateway.toml in a2a-gateway-config must set [server] host = "0.0.0.0"')
        port = cm_gateway.get('server', {}).get('port', a.port)
        r.expect(port == a.port, cm_f, f'gateway.toml in a2a-gateway-config sets port {port}, '
                 f'but the manifests use {a.port}')
        expected = json.loads(json.dumps(repo_gateway))
        expected.setdefault('server', {})['host'] = '0.0.0.0'
        diff = toml_diff(expected, cm_gateway)
        r.expect(not diff, cm_f, 'gateway.toml in a2a-gateway-config differs from the '
                 'repository\'s gateway.toml (beyond [server] host = "0.0.0.0"): '
                 + '; '.join(diff))
    agent_names: set[str] = set()
    if cm_agents is not None:
        data = cm_agents.get('data') or {}
        repo_agents = ROOT / 'agents.d'
        repo_files = {p.name: p for p in repo_agents.glob('*.toml')}
        repo_scripts = {p.name: p for p in (repo_agents / 'scripts').glob('*') if p.is_file()}
        for name, p in {**repo_files, **repo_scripts}.items():
            if not r.expect(name in data, cm_f, f'ConfigMap a2a-gateway-agents lacks {name} '
                            f'(agents.d/{rel(p).split("agents.d/", 1)[1]})'):
                continue
            r.expect(data[name].encode() == p.read_bytes(), cm_f,
                     f'ConfigMap a2a-gateway-agents: {name} is not a byte-for-byte copy of '
                     f'{rel(p)}')
        for key, text in data.items():
            if key.endswith('.toml'):
                parsed = read_toml(cm_f, r, text)
                if parsed is not None and 'name' in parsed:
                    agent_names.add(parsed['name'])
            elif key not in repo_scripts:
                r.fail(cm_f, f'ConfigMap a2a-gateway-agents: {key} is neither an agent file '
                       'nor a script of agents.d/scripts/')
        if cm_gateway is not None:
            gateway_agent_refs(cm_gateway, agent_names, rel(cm_f) + ' (gateway.toml)', r)
    grace = shutdown_grace(cm_gateway, a.shutdown_grace_secs)

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

    ann = tmpl['metadata'].get('annotations', {})
    r.expect(ann.get('prometheus.io/scrape') == 'true', where,
             'pod annotation prometheus.io/scrape must be "true"')
    mport = metrics_port(cm_gateway, a.port, rel(cm_f) + ' (gateway.toml)', r)
    r.expect(ann.get('prometheus.io/port') == str(mport), where,
             f'pod annotation prometheus.io/port is {ann.get("prometheus.io/port")!r}, '
             f'expected "{mport}"')
    r.expect(ann.get('prometheus.io/path') == a.metrics_path, where,
             f'pod annotation prometheus.io/path is {ann.get("prometheus.io/path")!r}, '
             f'expected {a.metrics_path}')

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
    tgp = pod.get('terminationGracePeriodSeconds', 30)
    r.expect(tgp > grace, where, f'terminationGracePeriodSeconds {tgp} leaves no room for the '
             f'gateway\'s drain (shutdown_grace_secs {grace:g})')
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
        s = secrets.get(ref.get('name'))
        if r.expect(s is not None, where, f'env {n} refers to Secret {ref.get("name")!r}, '
                    'which the manifests do not define'):
            keys = set(s.get('stringData') or {}) | set(s.get('data') or {})
            r.expect(ref.get('key') in keys, secret_f,
                     f'Secret {ref.get("name")} has no key {ref.get("key")!r} (env {n})')
        r.expect(ref.get('optional') is True, where, f'env {n}: secretKeyRef must be '
                 'optional: true (the gateway starts without it)')

    mounts = {m['mountPath'].rstrip('/'): m for m in c.get('volumeMounts', [])}
    volumes = {v['name']: v for v in pod.get('volumes', [])}
    for m in mounts.values():
        r.expect(m['name'] in volumes, where, f'volumeMount {m["name"]} has no volume')
        if 'configMap' in volumes.get(m['name'], {}):
            r.expect('subPath' not in m, where, f'volumeMount {m["name"]} uses subPath: its '
                     'files would never update on a ConfigMap change')
    for v in volumes.values():
        if 'configMap' in v:
            r.expect(v['configMap'].get('name') in configmaps, where,
                     f'volume {v["name"]} refers to ConfigMap {v["configMap"].get("name")!r}, '
                     'which the manifests do not define')

    def volume_at(path: str):
        m = mounts.get(path.rstrip('/'))
        return volumes.get(m['name']) if m else None

    cfg = flags.get('--config')
    k8s_layout = None
    cfg_volume = None
    if cfg:
        d, base = str(PurePosixPath(cfg).parent), PurePosixPath(cfg).name
        v = volume_at(d)
        if r.expect(v is not None and 'configMap' in v, where, f'--config {cfg}: no ConfigMap '
                    f'volume is mounted at {d}'):
            cfg_volume = v
            cm = configmaps.get(v['configMap']['name'], {})
            items = v['configMap'].get('items')
            projected = ({i['path'] for i in items} if items else set(cm.get('data') or {}))
            r.expect(base in projected, where, f'--config {cfg}: ConfigMap '
                     f'{v["configMap"]["name"]} does not project {base} there '
                     f'(it projects {sorted(projected)})')
    agents_dir = flags.get('--agents-dir')
    if agents_dir:
        v = volume_at(agents_dir)
        if r.expect(v is not None and 'configMap' in v, where, f'--agents-dir {agents_dir}: '
                    'no ConfigMap volume is mounted there'):
            cm = configmaps.get(v['configMap']['name'], {})
            data = cm.get('data') or {}
            items = v['configMap'].get('items')
            if items:
                keys = [i['key'] for i in items]
                r.expect(sorted(keys) == sorted(data), where,
                         f'volume {v["name"]} items project {sorted(keys)} of ConfigMap '
                         f'{v["configMap"]["name"]}, which holds {sorted(data)}: a key left '
                         'out of items is not mounted')
                for i in items:
                    repo = ROOT / 'agents.d' / i['path']
                    if repo.is_file():
                        want = 0o755 if repo.stat().st_mode & stat.S_IXUSR else 0o644
                        got = i.get('mode', v['configMap'].get('defaultMode', 0o644))
                        r.expect(got == want, where, f'{i["path"]} is projected with mode '
                                 f'{got:o}, the repository\'s agents.d/{i["path"]} has {want:o}')
                    else:
                        r.fail(where, f'{i["path"]} projected into {agents_dir} has no '
                               'counterpart in the repository\'s agents.d/')
            if cfg_volume is not None:
                k8s_layout = (cfg, agents_dir,
                              configmaps.get(cfg_volume['configMap']['name'], {}), cm,
                              cfg_volume['configMap'], v['configMap'])
    ctx['k8s_layout'] = k8s_layout

    # Service, PDB, HPA.
    if svc is not None:
        w = rel(svc_f)
        r.expect(svc['spec'].get('type', 'ClusterIP') == 'ClusterIP', w, 'type must be ClusterIP')
        r.expect(selector_matches(svc['spec'].get('selector'), labels), w,
                 'the selector does not match the Deployment\'s pod labels')
        sports = svc['spec'].get('ports', [])
        r.expect(any(p.get('port') == 80 for p in sports), w, 'no port 80')
        for p in sports:
            tp = p.get('targetPort', p.get('port'))
            r.expect(tp in ('http', a.port), w, f'port {p.get("port")} targets {tp!r}; '
                     f'expected the container port "http" ({a.port})')
        if replicas > 1 or hpa is not None:
            r.expect(svc['spec'].get('sessionAffinity') == 'ClientIP', w,
                     'with several replicas, sessionAffinity must be ClientIP: tasks live in '
                     'one replica\'s memory')
    if pdb is not None:
        w = rel(pdb_f)
        r.expect(selector_matches(pdb['spec'].get('selector'), labels), w,
                 'the selector does not match the Deployment\'s pod labels')
        r.expect(pdb['spec'].get('minAvailable') == 1, w, 'minAvailable must be 1')
        r.expect(replicas > pdb['spec'].get('minAvailable', 0), w,
                 f'minAvailable {pdb["spec"].get("minAvailable")} with {replicas} replicas '
                 'blocks every node drain')
    if hpa is not None:
        w = rel(hpa_f)
        ref = hpa['spec'].get('scaleTargetRef', {})
        r.expect((ref.get('apiVersion'), ref.get('kind'), ref.get('name')) ==
                 ('apps/v1', 'Deployment', dep['metadata']['name']), w,
                 f'scaleTargetRef {ref} is not the Deployment {dep["metadata"]["name"]}')
        lo, hi = hpa['spec'].get('minReplicas', 1), hpa['spec'].get('maxReplicas')
        r.expect((lo, hi) == (2, 10), w, f'replicas {lo}..{hi}, expected 2..10')
        r.expect(lo <= replicas <= hi, w, f'the Deployment\'s {replicas} replicas are outside '
                 f'{lo}..{hi}')
        cpu = [m for m in hpa['spec'].get('metrics', [])
               if m.get('type') == 'Resource' and m['resource'].get('name') == 'cpu']
        if r.expect(bool(cpu), w, 'no CPU metric'):
            util = cpu[0]['resource'].get('target', {}).get('averageUtilization')
            r.expect(util == 70, w, f'CPU target {util}%, expected 70%')
            r.expect('cpu' in res.get('requests', {}), where,
                     'the HPA scales on CPU utilisation, which needs resources.requests.cpu')

    # The same layout as the image: binary and paths.
    if docker.get('agents_dir') and agents_dir:
        r.expect(agents_dir == docker['agents_dir'], where,
                 f'--agents-dir {agents_dir} differs from the image\'s {docker["agents_dir"]}')
    r.ok(f'kubernetes: probes {a.health_path} / {a.ready_path} on port http ({a.port}), '
         f'Service 80 -> http, Prometheus annotations ({a.metrics_path}), --config/--agents-dir '
         'on ConfigMap directory mounts, ConfigMaps match the repository\'s gateway.toml and '
         'agents.d/', since)


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


REPLICAS = DEPLOY / 'compose.replicas.yaml'


def check_replicas_compose(a, r: Report, docker: dict, ctx: dict) -> None:
    """compose.replicas.yaml: three gateway replicas on one Redis store behind nginx."""
    where = rel(REPLICAS)
    since = r.mark()
    try:
        doc = yaml.safe_load(REPLICAS.read_text())
    except (OSError, yaml.YAMLError) as e:
        r.fail(where, f'cannot read: {e}')
        return
    services = (doc or {}).get('services') or {}
    gateways = [n for n in services if n.startswith('gateway-')]
    r.expect(len(gateways) == 3, where, f'three gateway replicas, found {gateways}')
    for name in ('redis', 'nginx'):
        r.expect(name in services, where, f'no service {name}')
    cfg = read_toml(DEPLOY / 'compose' / 'replicas.toml', r)
    store = (cfg or {}).get('store') or {}
    r.expect(store.get('kind') == 'redis', where, 'replicas.toml: [store] kind must be "redis"')
    r.expect(str(store.get('url', '')).startswith('redis://redis:'), where,
             f'replicas.toml: store.url {store.get("url")!r} does not name the redis service')
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
                 == (DEPLOY / 'compose' / 'replicas.toml').resolve() and src[1], where,
                 f'service {name}: --config {flags.get("--config")} is not ./compose/replicas.toml, read-only')
        r.expect('redis' in (gw.get('depends_on') or {}), where, f'service {name} does not wait for redis')
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
    r.ok(f'{where}: {len(gateways)} replicas with [store] kind = "redis" at the redis service, '
         'nginx upstream over all of them, unbuffered', since)


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
    layout = ctx.get('k8s_layout')
    if layout:
        cfg, agents_dir, cm_cfg, cm_agents, vol_cfg, vol_agents = layout
        with tempfile.TemporaryDirectory() as tmp:
            base = Path(tmp)
            cfg_dir = base / PurePosixPath(cfg).parent.relative_to('/')
            agents_path = base / PurePosixPath(agents_dir).relative_to('/')
            materialise_agents_volume(cm_cfg, vol_cfg, cfg_dir)
            materialise_agents_volume(cm_agents, vol_agents, agents_path)
            check('deploy/kubernetes ConfigMaps as mounted',
                  cfg_dir / PurePosixPath(cfg).name, agents_path, base)
    else:
        r.fail('deploy/kubernetes', 'the ConfigMaps were not run through `a2a-gateway check`: '
               'their volumes or mounts are broken (see above)')


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
    a = p.parse_args()
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
    check_replicas_compose(a, r, docker, ctx)
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
