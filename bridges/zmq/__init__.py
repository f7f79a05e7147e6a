"""ZeroMQ bridge between edge nodes (robots) and the learner.

Layers, bottom up (each module has one job):

* ``codec``     -- frames <-> (type, body, arrays): msgpack envelope + raw numpy frames, size/dtype limits
* ``protocol``  -- the message catalogue (Hello, Segment, Ack, WeightsAnnounce, ...) and strict validation
* ``segments``  -- ``Step`` lists <-> ``Segment`` messages (stacked float32 arrays, JPEG/PNG images)
* ``weights``   -- tensors <-> safetensors bytes, chunking, sha256 verification
* ``spool``     -- the edge's crash-safe on-disk queue of unacked segments
* ``keys``      -- CURVE key files, the loopback-only-plaintext policy, the server's allow-list
* ``admission`` -- what one sender may cost the learner (``PeerLimits``: rate, refusals, cool-off)
* ``weight_serving`` -- the versions the learner serves, pins, and its PUB of weight announcements
* ``server``    -- learner endpoint: ROUTER (requests, dispatched to handler callbacks) + weight serving
* ``client``    -- edge endpoint: DEALER + SUB, handshake, acks, re-sends, weight fetch (one thread)
* ``streaming`` -- ``StreamingClient``: ``client`` on a background thread behind a bounded queue

Typical use::

    # learner
    server = ZmqServer(ServerConfig(router_endpoint="tcp://*:5555", pub_endpoint="tcp://*:5556",
                                    curve=ServerCurve.from_files("keys/learner.key_secret", "keys/robots")),
                       handlers=MyIngest())
    server.publish_weights(WeightsBlob(version=1, data=serialize_tensors(state_dict), config_hash=h))
    while running: server.serve_once(100)

    # edge
    link = StreamingClient(ClientConfig(robot_id="so101-a", router_endpoint="tcp://learner:5555",
                                        pub_endpoint="tcp://learner:5556", spool_dir="spool/", config_hash=h,
                                        curve=ClientCurve.from_files("keys/so101-a.key_secret", "keys/learner.key")),
                           on_weights=lambda announce, data: loader.stage(deserialize_tensors(data, framework="pt")))
    link.start(); link.submit_steps(episode_id, steps)
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from robot_rl.core.lazy_exports import lazy_exports

if TYPE_CHECKING:  # what the lazy exports below are, for type checkers
    from robot_rl.bridges.zmq.client import ClientConfig, ClientStats, ZmqClient
    from robot_rl.bridges.zmq.codec import ALLOWED_DTYPES, PROTOCOL_VERSION, Limits, ProtocolError
    from robot_rl.bridges.zmq.keys import (
        ClientCurve,
        InsecureEndpointError,
        KeyPair,
        ServerCurve,
        generate_keypair,
        is_loopback,
        load_keypair,
        load_public_key,
        load_public_keys,
    )
    from robot_rl.bridges.zmq.protocol import (
        MESSAGE_TYPES,
        Ack,
        Error,
        Heartbeat,
        Hello,
        HelloOk,
        Message,
        Segment,
        Stats,
        WeightsAnnounce,
        WeightsChunk,
        WeightsFetch,
        config_hash,
        decode_message,
        encode_message,
    )
    from robot_rl.bridges.zmq.segments import ImageEncoding, decode_segment, encode_segment
    from robot_rl.bridges.zmq.server import Peer, ServerConfig, ServerHandlers, ZmqServer
    from robot_rl.bridges.zmq.spool import Spool, SpoolError
    from robot_rl.bridges.zmq.streaming import StreamingClient
    from robot_rl.bridges.zmq.weights import (
        ChunkAssembler,
        TensorView,
        WeightsBlob,
        WeightsError,
        deserialize_tensors,
        serialize_tensors,
        sha256_hex,
        snapshot_buffer,
        tensor_views,
        version_digest,
    )

# Exported lazily: the configuration reads ``link.LinkConfig``, and a config must not import the
# codecs (OpenCV for JPEG frames) and sockets with it.
_EXPORTS = {
    "ClientConfig": "client",
    "ClientStats": "client",
    "ZmqClient": "client",
    "ALLOWED_DTYPES": "codec",
    "PROTOCOL_VERSION": "codec",
    "Limits": "codec",
    "ProtocolError": "codec",
    "ClientCurve": "keys",
    "InsecureEndpointError": "keys",
    "KeyPair": "keys",
    "ServerCurve": "keys",
    "generate_keypair": "keys",
    "is_loopback": "keys",
    "load_keypair": "keys",
    "load_public_key": "keys",
    "load_public_keys": "keys",
    "MESSAGE_TYPES": "protocol",
    "Ack": "protocol",
    "Error": "protocol",
    "Heartbeat": "protocol",
    "Hello": "protocol",
    "HelloOk": "protocol",
    "Message": "protocol",
    "Segment": "protocol",
    "Stats": "protocol",
    "WeightsAnnounce": "protocol",
    "WeightsChunk": "protocol",
    "WeightsFetch": "protocol",
    "config_hash": "protocol",
    "decode_message": "protocol",
    "encode_message": "protocol",
    "ImageEncoding": "segments",
    "decode_segment": "segments",
    "encode_segment": "segments",
    "Peer": "server",
    "ServerConfig": "server",
    "ServerHandlers": "server",
    "ZmqServer": "server",
    "Spool": "spool",
    "SpoolError": "spool",
    "StreamingClient": "streaming",
    "ChunkAssembler": "weights",
    "TensorView": "weights",
    "WeightsBlob": "weights",
    "WeightsError": "weights",
    "deserialize_tensors": "weights",
    "serialize_tensors": "weights",
    "sha256_hex": "weights",
    "snapshot_buffer": "weights",
    "version_digest": "weights",
    "tensor_views": "weights",
}

__getattr__ = lazy_exports(__name__, _EXPORTS)


__all__ = [
    "ALLOWED_DTYPES",
    "MESSAGE_TYPES",
    "PROTOCOL_VERSION",
    "Ack",
    "ChunkAssembler",
    "ClientConfig",
    "ClientCurve",
    "ClientStats",
    "Error",
    "Heartbeat",
    "Hello",
    "HelloOk",
    "ImageEncoding",
    "InsecureEndpointError",
    "KeyPair",
    "Limits",
    "Message",
    "Peer",
    "ProtocolError",
    "Segment",
    "ServerConfig",
    "ServerCurve",
    "ServerHandlers",
    "Spool",
    "SpoolError",
    "Stats",
    "StreamingClient",
    "TensorView",
    "WeightsAnnounce",
    "WeightsBlob",
    "WeightsChunk",
    "WeightsError",
    "WeightsFetch",
    "ZmqClient",
    "ZmqServer",
    "config_hash",
    "decode_message",
    "decode_segment",
    "deserialize_tensors",
    "encode_message",
    "encode_segment",
    "generate_keypair",
    "is_loopback",
    "load_keypair",
    "load_public_key",
    "load_public_keys",
    "serialize_tensors",
    "sha256_hex",
    "snapshot_buffer",
    "tensor_views",
    "version_digest",
]
