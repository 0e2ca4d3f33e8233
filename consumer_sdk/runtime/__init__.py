"""The runtime: `Consumer` and `GroupMember` around the sans-IO core, the shared network loop
and the data plane.

- `group_member`: `GroupMember`, the application side of a member (its API, the user
  callbacks, waiting for the loop's results);
- `consumer`: `Consumer`, confluent-kafka's ``Consumer`` API on a `GroupMember` plus the
  data plane;
- `member_network`: `MemberNetwork`, the network side of one member: the membership core
  with its heartbeat manager and the coordinator, metadata and commit request managers,
  run by the loop;
- `netloop`: `NetworkLoop`, the process-wide network thread: shared broker connections
  (`consumer_sdk.protocol.multiplex`) and timers;
- `fetcher`: the data plane, records fetched by an assign-only ``confluent_kafka.Consumer``;
- `offsets`: the application-side view of committed offsets;
- `completion`: `Completion`, one outcome a blocking call waits for with a deadline (being
  adopted: the member driver of issue 20 builds every blocking call on it);
- `_librdkafka`: the ctypes edge (group metadata for transactions, waking a blocked fetch).

Imports: `consumer_sdk.membership` (the core and its request managers),
`consumer_sdk.protocol` (connections and codecs), ``confluent_kafka`` (the data plane and
its error types), `consumer_sdk.config`, ``domain``, ``errors``, ``error_codes`` and
`consumer_sdk.observability.log_routing`. The sans-IO packages below it never import it
(``tests/test_import_contract.py``).

Threads:

- The application thread runs every public method and every user callback (``on_assign``,
  ``on_revoke``, ``on_lost``, ``on_commit``, ``error_cb``), inside ``poll()``, ``consume()``,
  ``commit()``, ``unsubscribe()`` and ``close()``. Its blocking calls wait, with deadlines,
  for events the loop thread sets.
- One network-loop thread per process (`NetworkLoop`, shared by every member) owns every
  group connection and timer, runs each `MemberNetwork` when it is due, applies responses
  as they arrive, and runs the hooks a member gave its `MemberNetwork` (named ``_on_loop_*``
  in `GroupMember`). It never waits for a broker: connection setup and SASL
  re-authentication run on short-lived helper threads that hand the socket back.
- The data plane belongs to the application thread, which calls the `Fetcher`'s
  ``confluent_kafka.Consumer`` (librdkafka fetches on its own threads). The loop thread
  touches it only to fence partitions, to end the application's wait inside librdkafka, and
  to read positions for an auto-commit (under the fetcher's ``_flight`` lock, for a bounded
  time).
- The membership core is shared today: the loop thread runs it, and the application thread
  submits events to it and reads its state, serialized by the member's lock
  (`MemberNetwork.lock`).
"""
