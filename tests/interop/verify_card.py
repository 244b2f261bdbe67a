"""Checks the gateway's signature on a card, twice, independently of the gateway's code.

    python verify_card.py --card-url URL --jwks-url URL [--a2a-version 1.0] [--api-key KEY]

1. jwcrypto over rfc8785: the card without `signatures` and without empty members,
   canonicalized by RFC 8785, is the detached payload of each JWS in `signatures`, checked
   against the JWKS (the key its protected header names).
2. The official a2a-sdk's verifier (a2a.utils.signing), on the card parsed into its 1.0
   proto (for a 1.0 card only: a hybrid card's 0.3 members are not in that proto).
Each is also run on a tampered copy (its description changed), which must fail. Prints
one JSON object: {"jwcrypto": bool, "jwcrypto_tampered": bool, "sdk": bool|null,
"sdk_tampered": bool|null, "kid": str}.
"""

import argparse
import base64
import copy
import json

import httpx
import rfc8785
from jwcrypto import jwk, jws


def without_empty(value):
    """The members the signature covers: no empty strings, lists, objects or nulls."""
    if isinstance(value, dict):
        kept = {k: c for k, v in value.items() if (c := without_empty(v)) is not None}
        return kept or None
    if isinstance(value, list):
        kept = [c for v in value if (c := without_empty(v)) is not None]
        return kept or None
    if value is None or value == '':
        return None
    return value


def jwcrypto_verifies(card: dict, keys: jwk.JWKSet) -> bool:
    body = {k: v for k, v in card.items() if k != 'signatures'}
    payload = rfc8785.dumps(without_empty(body) or {})
    for signature in card.get('signatures', []):
        token = jws.JWS()
        try:
            token.deserialize(f"{signature['protected']}..{signature['signature']}")
            header = json.loads(base64.urlsafe_b64decode(signature['protected'] + '=='))
            key = keys.get_key(header['kid'])
            token.verify(key, detached_payload=payload)
            return True
        except Exception:  # noqa: BLE001 - any failure is "does not verify"
            continue
    return False


def sdk_verifies(card: dict, jwks: dict) -> bool:
    from google.protobuf.json_format import ParseDict
    from jwt.api_jwk import PyJWK
    from a2a.types import AgentCard
    from a2a.utils.signing import SignatureVerificationError, create_signature_verifier

    keys = {k['kid']: PyJWK(k) for k in jwks['keys']}
    verifier = create_signature_verifier(lambda kid, _jku: keys[kid], ['ES256'])
    try:
        verifier(ParseDict(card, AgentCard()))
        return True
    except (SignatureVerificationError, KeyError):
        return False


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('--card-url', required=True)
    parser.add_argument('--jwks-url', required=True)
    parser.add_argument('--a2a-version')
    parser.add_argument('--api-key')
    parser.add_argument('--method', help='a JSON-RPC method whose result is the card (POSTed to --card-url)')
    args = parser.parse_args()
    headers = {}
    if args.a2a_version:
        headers['A2A-Version'] = args.a2a_version
    if args.api_key:
        headers['X-API-Key'] = args.api_key
    with httpx.Client(timeout=10, headers=headers) as http:
        if args.method:
            body = {'jsonrpc': '2.0', 'id': 1, 'method': args.method, 'params': {}}
            card = http.post(args.card_url, json=body).raise_for_status().json()['result']
        else:
            card = http.get(args.card_url).raise_for_status().json()
        jwks = http.get(args.jwks_url).raise_for_status().json()
    keys = jwk.JWKSet.from_json(json.dumps(jwks))
    tampered = copy.deepcopy(card)
    tampered['description'] = (card.get('description') or '') + ' (changed)'
    v10 = args.a2a_version == '1.0'
    header = json.loads(base64.urlsafe_b64decode(card['signatures'][0]['protected'] + '=='))
    print(json.dumps({
        'kid': header.get('kid'),
        'jwcrypto': jwcrypto_verifies(card, keys),
        'jwcrypto_tampered': jwcrypto_verifies(tampered, keys),
        'sdk': sdk_verifies(card, jwks) if v10 else None,
        'sdk_tampered': sdk_verifies(tampered, jwks) if v10 else None,
    }))


if __name__ == '__main__':
    main()
