"""How every test peer under tests/interop listens (standard library only, so each venv
can import it): a socket bound before the app is built, so `--port 0` is resolved before
a card that carries the port is made; and the bound port written to `--ready-file`
(decimal, then a newline, atomically) once the server accepts connections."""

import asyncio
import os
import socket


def bind(host: str, port: int) -> socket.socket:
    """A bound (not yet listening) TCP socket."""
    family = socket.AF_INET6 if ':' in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.set_inheritable(True)
    return sock


async def serve(server, sock: socket.socket, ready_file: str | None) -> None:
    """Runs a uvicorn.Server on `sock`; writes `ready_file` once it has started."""
    task = asyncio.create_task(server.serve(sockets=[sock]))
    while not server.started and not task.done():
        await asyncio.sleep(0.02)
    if server.started and ready_file:
        tmp = f'{ready_file}.{os.getpid()}.tmp'
        with open(tmp, 'w') as f:
            f.write(f'{sock.getsockname()[1]}\n')
        os.replace(tmp, ready_file)
    await task
