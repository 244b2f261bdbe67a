"""Raw gRPC calls to the gateway's A2A 1.0 service, for the tests that check each answer.

    python grpc_probe.py TARGET [CA_PEM [CERT_PEM KEY_PEM]] < calls.json
        (with CA_PEM: over TLS; with CERT_PEM and KEY_PEM: presenting that client certificate)

calls.json is a list of calls, made in order on one channel:
    {"method": "GetTask", "request": {...ProtoJSON...}, "metadata": {"x-api-key": "..."},
     "timeout": 5, "raw": "<hex>"}
`raw` sends those bytes instead of `request` (a malformed message); `stream` methods
(SendStreamingMessage, SubscribeToTask) collect every message, or the first `take`.
Prints one JSON list: per call its status code name, message, the ErrorInfo reason and
metadata of grpc-status-details-bin, the initial and trailing metadata, and the
response(s) as ProtoJSON. Built on grpcio and the message classes of the official a2a-sdk.
"""

import json
import sys

import grpc
from google.protobuf import json_format
from google.rpc import error_details_pb2, status_pb2

from a2a.types import a2a_pb2

SERVICE = a2a_pb2.DESCRIPTOR.services_by_name['A2AService']
STREAMING = {'SendStreamingMessage', 'SubscribeToTask'}


def message_class(descriptor):
    return getattr(a2a_pb2, descriptor.name, None) or _wkt(descriptor)


def _wkt(descriptor):
    from google.protobuf import empty_pb2
    return {'Empty': empty_pb2.Empty}[descriptor.name]


def details_of(trailing):
    for key, value in trailing or ():
        if key == 'grpc-status-details-bin':
            status = status_pb2.Status.FromString(value)
            for any_ in status.details:
                info = error_details_pb2.ErrorInfo()
                if any_.Unpack(info):
                    return {'reason': info.reason, 'domain': info.domain,
                            'metadata': dict(info.metadata), 'code': status.code}
    return None


def md(pairs):
    return {k: (v if isinstance(v, str) else v.hex()) for k, v in (pairs or ())}


def call(channel, spec):
    name = spec['method']
    method = SERVICE.methods_by_name.get(name)
    path = f'/lf.a2a.v1.A2AService/{name}'
    out_class = message_class(method.output_type) if method else None
    if 'raw' in spec:
        payload = bytes.fromhex(spec['raw'])
    else:
        request = message_class(method.input_type)()
        json_format.ParseDict(spec.get('request', {}), request)
        payload = request.SerializeToString()
    metadata = list(spec.get('metadata', {}).items())
    timeout = spec.get('timeout', 10)
    decode = (lambda b: b) if out_class is None else out_class.FromString
    result = {'method': name}
    try:
        if name in STREAMING:
            rpc = channel.unary_stream(path, request_serializer=None,
                                       response_deserializer=decode)
            responses = rpc(payload, timeout=timeout, metadata=metadata)
            messages = []
            for m in responses:
                messages.append(json_format.MessageToDict(m))
                if len(messages) == spec.get('take', -1):
                    responses.cancel()
                    break
            result['responses'] = messages
            result['initial'] = md(responses.initial_metadata())
            if len(messages) != spec.get('take', -1):
                result['trailing'] = md(responses.trailing_metadata())
            result['code'] = 'OK'
        else:
            rpc = channel.unary_unary(path, request_serializer=None,
                                      response_deserializer=decode)
            response, outcome = rpc.with_call(payload, timeout=timeout, metadata=metadata)
            result['response'] = (json_format.MessageToDict(response)
                                  if out_class is not None else response.hex())
            result['initial'] = md(outcome.initial_metadata())
            result['trailing'] = md(outcome.trailing_metadata())
            result['code'] = 'OK'
    except grpc.RpcError as e:
        result['code'] = e.code().name
        result['message'] = e.details()
        trailing = e.trailing_metadata()
        result['error_info'] = details_of(trailing)
        result['initial'] = md(e.initial_metadata())
        result['trailing'] = md(trailing)
        if name in STREAMING and 'messages' in locals():
            result['responses'] = messages
    return result


def main():
    target = sys.argv[1]
    calls = json.load(sys.stdin)
    options = [('grpc.max_send_message_length', 64 << 20)]
    if len(sys.argv) > 2:
        # TLS, trusting only the CA (PEM) named here.
        pems = []
        for path in sys.argv[2:5]:
            with open(path, 'rb') as f:
                pems.append(f.read())
        cert, key = (pems[1], pems[2]) if len(pems) == 3 else (None, None)
        credentials = grpc.ssl_channel_credentials(
            root_certificates=pems[0], private_key=key, certificate_chain=cert)
        channel = grpc.secure_channel(target, credentials, options=options)
    else:
        channel = grpc.insecure_channel(target, options=options)
    with channel:
        results = [call(channel, spec) for spec in calls]
    print(json.dumps(results))


if __name__ == '__main__':
    main()
