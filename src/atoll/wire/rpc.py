"""Client stubs and server registration for atoll.proto's services, read from its descriptors.

The one difference from grpc_tools' generated `_pb2_grpc` code: messages of type `Frame` pass
as raw bytes (see wire/frames.py), so payload bytes are never parsed or re-serialized by
protobuf. Every other message uses its protobuf class as usual.
"""

from __future__ import annotations

from typing import Any

import grpc

from atoll.wire import atoll_pb2 as pb

RAW_TYPE = "atoll.v1.Frame"

_KINDS = {  # (client_streaming, server_streaming) -> (channel factory, handler factory)
    (False, False): ("unary_unary", grpc.unary_unary_rpc_method_handler),
    (False, True): ("unary_stream", grpc.unary_stream_rpc_method_handler),
    (True, False): ("stream_unary", grpc.stream_unary_rpc_method_handler),
    (True, True): ("stream_stream", grpc.stream_stream_rpc_method_handler),
}


def _codec(descriptor) -> tuple[Any, Any]:
    """(serializer, deserializer) for one message type; None, None keeps it raw bytes."""
    if descriptor.full_name == RAW_TYPE:
        return None, None
    cls = getattr(pb, descriptor.name)
    return cls.SerializeToString, cls.FromString


def _methods(service: str):
    desc = pb.DESCRIPTOR.services_by_name[service]
    for method in desc.methods:
        kind = _KINDS[(method.client_streaming, method.server_streaming)]
        yield method, f"/{desc.full_name}/{method.name}", kind


class Stub:
    """Callables named like the service's methods, e.g. `stub(channel, "Admin").Call(...)`."""

    def __init__(self, channel: grpc.Channel, service: str):
        for method, path, (factory, _) in _methods(service):
            request_out, _ = _codec(method.input_type)
            _, response_in = _codec(method.output_type)
            call = getattr(channel, factory)(path, request_serializer=request_out,
                                             response_deserializer=response_in)
            setattr(self, method.name, call)


def stub(channel: grpc.Channel, service: str) -> Any:
    return Stub(channel, service)


def add_servicer(server: grpc.Server, service: str, servicer: object) -> None:
    """Serve `service` with servicer's methods of the same names."""
    handlers = {}
    for method, _, (_, handler) in _methods(service):
        _, request_in = _codec(method.input_type)
        response_out, _ = _codec(method.output_type)
        handlers[method.name] = handler(getattr(servicer, method.name),
                                        request_deserializer=request_in,
                                        response_serializer=response_out)
    full_name = pb.DESCRIPTOR.services_by_name[service].full_name
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(full_name, handlers),))
