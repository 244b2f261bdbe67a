"""Interop checks: the official a2a-sdk client spreading one conversation over replicas.

    python sdk_replicas.py --card-url URL_A --card-url URL_B --card-url URL_C --dialect 1.0|0.3

Each card URL is one gateway replica's card for the "echo" agent; the replicas share a
Redis store. A task is made through one replica and read, answered and canceled through
the others, each call through the SDK's own transports (see sdk_client.py).
Prints "PASS name" / "FAIL name: details" per check; exit 0 only if all pass.
"""

import argparse
import asyncio
import sys

import httpx

from a2a.types import CancelTaskRequest, GetTaskRequest

from sdk_client import (S, TIMEOUT, Checks, artifacts_text, describe, expect, resolve_card,
                        state_name, user_message)


async def check_read_elsewhere(a: Checks, b: Checks, c: Checks):
    task = await a.send_for_task(user_message('made on one replica'))
    for other in (b, c):
        got = await other.call(other.client(False).get_task(GetTaskRequest(id=task.id), context=other.ctx))
        expect(got.id == task.id, f'got task {got.id}')
        expect(got.status.state == S.TASK_STATE_COMPLETED, f'state {state_name(got.status.state)}')
        expect(artifacts_text(got) == 'made on one replica', f'artifact text {artifacts_text(got)!r}')


async def check_answer_elsewhere(a: Checks, b: Checks, c: Checks):
    task = await a.send_for_task(user_message('/input What is your name?'))
    expect(task.status.state == S.TASK_STATE_INPUT_REQUIRED, f'state {state_name(task.status.state)}')
    done = await b.send_for_task(user_message('Ada', task=task))
    expect(done.id == task.id, f'follow-up answered by task {done.id}, not {task.id}')
    expect(done.status.state == S.TASK_STATE_COMPLETED, f'follow-up state {state_name(done.status.state)}')
    expect(artifacts_text(done) == 'Ada', f'follow-up artifact text {artifacts_text(done)!r}')


async def check_cancel_elsewhere(a: Checks, b: Checks, c: Checks):
    task = await a.send_for_task(user_message('/delay 30 slow'), return_immediately=True)
    canceled = await c.call(c.client(False).cancel_task(CancelTaskRequest(id=task.id), context=c.ctx))
    expect(canceled.status.state == S.TASK_STATE_CANCELED, f'cancel state {state_name(canceled.status.state)}')
    again = await b.call(b.client(False).get_task(GetTaskRequest(id=task.id), context=b.ctx))
    expect(again.status.state == S.TASK_STATE_CANCELED, f'get-after-cancel state {state_name(again.status.state)}')


CHECKS = [check_read_elsewhere, check_answer_elsewhere, check_cancel_elsewhere]


async def run(card_urls: list[str], dialect: str) -> int:
    failures = 0
    async with httpx.AsyncClient(timeout=TIMEOUT) as http:
        http.headers['A2A-Version'] = '1.0'
        replicas = [Checks(await resolve_card(u, http), dialect, http) for u in card_urls]
        for check in CHECKS:
            name = check.__name__.removeprefix('check_').replace('_', '-')
            try:
                await check(*replicas)
                print(f'PASS {name}', flush=True)
            except Exception as e:  # noqa: BLE001 - report any SDK/transport error
                failures += 1
                print(f'FAIL {name}: {describe(e)}', flush=True)
        for r in replicas:
            for client in r.clients.values():
                await client.close()
    print(f'{len(CHECKS) - failures} passed, {failures} failed')
    return 1 if failures else 0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('--card-url', action='append', required=True)
    parser.add_argument('--dialect', choices=['1.0', '0.3'], required=True)
    args = parser.parse_args()
    expect(len(args.card_url) == 3, 'three --card-url, one per replica')
    sys.exit(asyncio.run(run(args.card_url, args.dialect)))


if __name__ == '__main__':
    main()
