"""httpx with base_url= against the gateway, as many JSON-RPC clients are written.

    python httpx_base_url.py --agent-url http://127.0.0.1:PORT/a2a/agents/echo \
        --gateway-url http://127.0.0.1:PORT

An httpx client whose base_url is the agent URL (with and without a trailing slash) and
that posts to "/" sends POST /a2a/agents/echo/. Each check prints PASS or FAIL; the last
line is "N passed, M failed".
"""

import argparse
import sys
import uuid

import httpx


def message(text: str) -> dict:
    return {'messageId': str(uuid.uuid4()), 'role': 'ROLE_USER', 'parts': [{'text': text}]}


def rpc(method: str, params: dict, rpc_id='1') -> dict:
    return {'jsonrpc': '2.0', 'id': rpc_id, 'method': method, 'params': params}


def send_v10(client: httpx.Client, path: str) -> None:
    r = client.post(path, json=rpc('SendMessage', {'message': message('hi there')}),
                    headers={'A2A-Version': '1.0'})
    assert r.status_code == 200, (r.status_code, r.text)
    task = r.json()['result']['task']
    assert task['status']['state'] == 'TASK_STATE_COMPLETED', task
    assert task['artifacts'][0]['parts'][0]['text'] == 'hi there', task


def send_v03(client: httpx.Client, path: str) -> None:
    msg = {'kind': 'message', 'messageId': str(uuid.uuid4()), 'role': 'user',
           'parts': [{'kind': 'text', 'text': 'hello'}]}
    r = client.post(path, json=rpc('message/send', {'message': msg}))
    assert r.status_code == 200, (r.status_code, r.text)
    assert r.json()['result']['status']['state'] == 'completed', r.text


def unknown_path(client: httpx.Client) -> None:
    r = client.post('/a2a/nowhere', json=rpc('SendMessage', {'message': message('x')}, 'q-7'))
    assert r.status_code == 404, (r.status_code, r.text)
    body = r.json()
    assert body['jsonrpc'] == '2.0' and body['id'] == 'q-7', body
    assert body['error']['code'] == -32044, body


def unknown_agent(client: httpx.Client) -> None:
    r = client.post('/a2a/agents/ghost/', json=rpc('message/send', {}, 9))
    assert r.status_code == 404, (r.status_code, r.text)
    body = r.json()
    assert body['id'] == 9 and body['error']['code'] == -32040, body
    assert 'echo' in body['error']['data']['availableAgents'], body


def card(client: httpx.Client) -> None:
    r = client.get('/.well-known/agent-card.json')
    assert r.status_code == 200 and r.json()['name'], (r.status_code, r.text)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('--agent-url', required=True)
    parser.add_argument('--gateway-url', required=True)
    args = parser.parse_args()
    agent = args.agent_url.rstrip('/')
    checks = []
    for base in (agent, agent + '/'):
        client = httpx.Client(base_url=base, timeout=10)
        checks += [
            (f'1.0 send to "/" on {base}', lambda c=client: send_v10(c, '/')),
            (f'0.3 send to "" on {base}', lambda c=client: send_v03(c, '')),
        ]
    agent_card = httpx.Client(base_url=agent + '/', timeout=10)
    gateway = httpx.Client(base_url=args.gateway_url, timeout=10)
    checks += [
        ('agent card with a base URL', lambda: card(agent_card)),
        ('unknown path answers JSON-RPC', lambda: unknown_path(gateway)),
        ('unknown agent answers JSON-RPC', lambda: unknown_agent(gateway)),
    ]
    failed = 0
    for name, check in checks:
        try:
            check()
            print(f'PASS {name}')
        except Exception as e:  # noqa: BLE001 - report every failure
            failed += 1
            print(f'FAIL {name}: {type(e).__name__}: {e}')
    print(f'{len(checks) - failed} passed, {failed} failed')
    return 1 if failed else 0


if __name__ == '__main__':
    sys.exit(main())
