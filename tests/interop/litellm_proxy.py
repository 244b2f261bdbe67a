"""LiteLLM proxy (OpenAI-compatible LLM gateway) run offline for interop tests.

Serves the LiteLLM proxy's FastAPI app (litellm.proxy.proxy_server:app) under
uvicorn with a config of mock models (default tests/interop/thirdparty/
litellm.yaml: model_list entries whose litellm_params.mock_response answer
without calling any provider). No database, no .env, no network: the model
cost map is read from the wheel (LITELLM_LOCAL_MODEL_COST_MAP=True).

    python litellm_proxy.py --port 0 --ready-file PATH [--master-key sk-...] [--config YAML]

--master-key (default: $LITELLM_MASTER_KEY) is required: the proxy refuses to
start without one, or with a known default; requests need
"Authorization: Bearer <key>". No key gets 401; a wrong key gets 400
{"error":{"message":"No connected db.","type":"no_db_connection",...}} (without a
database every other key is taken for a virtual key, which needs one).
--port 0 binds a free port; --ready-file PATH gets that port (decimal, then a
newline), written atomically once the proxy has loaded its config and accepts
connections. Start-up takes 12-18 s on 2 cores, nearly all of it importing the
proxy; the port is bound (not listening) from the start. If the proxy's own
start-up fails (e.g. a publicly known master key such as sk-1234 is refused)
the process exits 3 and no ready file is written.

Endpoints the tests use: POST /v1/chat/completions (blocking, or
"stream": true for SSE "data: {chunk}" lines ending "data: [DONE]"; the mock
streams its text in 3-character deltas) and GET /v1/models.
"""

import argparse
import asyncio
import os
import sys
from pathlib import Path

from listening import bind, serve

DEFAULT_CONFIG = Path(__file__).resolve().parent / 'thirdparty' / 'litellm.yaml'

# Set before litellm is imported: it reads them at import or start-up.
OFFLINE_ENV = {
    'LITELLM_MODE': 'PRODUCTION',            # do not load a .env from the cwd
    'LITELLM_LOCAL_MODEL_COST_MAP': 'True',  # no fetch of the model cost map
    'LITELLM_DONT_SHOW_FEEDBACK_BOX': 'true',
    'LITELLM_LOG': 'ERROR',
    'DISABLE_ADMIN_UI': 'True',
}
# Would give the proxy a database, a cache or another config than ours.
DROP_ENV = ('DATABASE_URL', 'DIRECT_URL', 'WORKER_CONFIG', 'REDIS_HOST', 'REDIS_URL',
            'REDIS_PORT', 'LITELLM_CONFIG_BUCKET_NAME')


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('--host', default='127.0.0.1')
    parser.add_argument('--port', type=int, required=True, help='0 = any free port')
    parser.add_argument('--ready-file', help='write the bound port here once listening')
    parser.add_argument('--config', default=str(DEFAULT_CONFIG), help='LiteLLM proxy YAML')
    parser.add_argument('--master-key', default=os.environ.get('LITELLM_MASTER_KEY'),
                        help='proxy master key (default: $LITELLM_MASTER_KEY)')
    parser.add_argument('--log-level', default='warning')
    args = parser.parse_args()
    if not args.master_key:
        parser.exit(2, 'litellm proxy: no master key (--master-key or LITELLM_MASTER_KEY)\n')
    config = Path(args.config).resolve()
    if not config.is_file():
        parser.exit(2, f'litellm proxy: no config file {config}\n')

    for name in DROP_ENV:
        os.environ.pop(name, None)
    os.environ.update(OFFLINE_ENV)
    os.environ['LITELLM_MASTER_KEY'] = args.master_key
    os.environ['CONFIG_FILE_PATH'] = str(config)

    try:
        sock = bind(args.host, args.port)
    except OSError as e:
        parser.exit(1, f'litellm proxy: cannot bind {args.host}:{args.port}: {e}\n')

    import uvicorn  # noqa: E402  (after the environment is set)
    from litellm.proxy.proxy_server import app  # noqa: E402  (15 s or so)

    server = uvicorn.Server(uvicorn.Config(app, log_level=args.log_level,
                                           timeout_graceful_shutdown=2))
    asyncio.run(serve(server, sock, args.ready_file))
    if not server.started:
        sys.exit(3)  # the proxy's start-up failed; its reason is on stderr


if __name__ == '__main__':
    main()
