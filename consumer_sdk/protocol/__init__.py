"""The wire layer: Kafka framing, ``kio`` conversions, broker connections and a cluster client.

- `framing`, `frame_guard`, `heartbeat_codec`, `messages`: pure encoding and decoding
  (length-prefixed frames and headers, the bounds check run before kio's native decoder, the
  fast ConsumerGroupHeartbeat encoder, conversions between domain types and kio entities);
- `connection`: `BrokerConnection`, a blocking connection to one broker (TLS, SASL,
  ApiVersions negotiation, one request in flight);
- `multiplex`: `MuxConnection`, a non-blocking connection with many requests in flight, for
  the runtime's network loop;
- `client`: `ClusterClient`, a blocking client of a whole cluster (bootstrap, Metadata with
  topic ids, FindCoordinator, routing, reconnect) for the CLI, tools and test clusters;
- `security`, `sasl`, `oauth`: connection settings, SASL exchanges, OAUTHBEARER tokens.

Imports: ``kio`` (nowhere else in the SDK; the test proxies of `consumer_sdk.testing` also
use it to play a broker), the standard library's sockets and TLS, ``cryptography``,
``tenacity``, and `consumer_sdk.domain`, ``errors``, ``error_codes``. It never imports
`consumer_sdk.membership`, ``runtime`` or ``coordinator``: the rest of the SDK reaches the
wire through domain types.

Threads: the pure modules and the SASL step functions run on whoever calls them and never
block. `BrokerConnection` and `ClusterClient` block their caller and are thread-safe (a lock
per connection, one for the routing tables). A `MuxConnection` belongs to the one
network-loop thread: only that thread submits, reads and flushes, and request callbacks run
there; its blocking setup runs on a helper thread before the socket is handed over. Token
sources (`oauth`) may block while they fetch a token, which happens during connection setup.
"""
