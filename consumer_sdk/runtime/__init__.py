"""The runtime: `Consumer` and `GroupMember` around the sans-IO core, the shared network loop
and the data plane.

- `group_member`: `GroupMember`, the application side of a member (its API, the user
  callbacks, waiting for the loop's results);
- `consumer`: `Consumer`, confluent-kafka's ``Consumer`` API on a `GroupMember` plus the
  data plane;
- `driver`: `MemberDriver`, one member's request managers and the order between them,
  sans I/O (events, responses, failures and time in; requests through a `Transport`,
  application-bound events and a `MemberSnapshot` out); the simulator drives it too;
- `member_network`: `MemberNetwork`, the adapter that runs a member's driver on the loop;
- `transport`: `LoopTransport`, the driver's requests over the loop's shared connections;
- `boundary`: the one error boundary (exceptions to the driver's `Failure` values and back);
- `netloop`: `NetworkLoop`, the process-wide network thread: shared broker connections
  (`consumer_sdk.protocol.multiplex`) and timers;
- `fetcher`: the data plane, records fetched by an assign-only ``confluent_kafka.Consumer``;
- `offsets`: the application-side view of committed offsets;
- `completion`: `Completion`, one outcome a blocking call waits for with a deadline (every
  blocking call of the application side: commit_sync, committed, metrics);
- `_librdkafka`: the ctypes edge (group metadata for transactions, waking a blocked fetch).

Imports: `consumer_sdk.membership` (the core and its request managers),
`consumer_sdk.protocol` (connections and codecs), ``confluent_kafka`` (the data plane and
its error types), `consumer_sdk.config`, ``domain``, ``errors``, ``error_codes`` and
`consumer_sdk.observability.log_routing`; `driver` imports only the sans-IO layers (the
simulator runs it). The sans-IO packages below it never import it
(``tests/test_import_contract.py``).

Threads:

- The application thread runs every public method and every user callback (``on_assign``,
  ``on_revoke``, ``on_lost``, ``on_commit``, ``error_cb``), inside ``poll()``, ``consume()``,
  ``commit()``, ``unsubscribe()`` and ``close()``. It sends the loop events and requests
  (the member's inbox), waits on a `Completion` with a deadline for each blocking call,
  drains the events the loop queued for it, and reads the member's frozen `MemberSnapshot`
  (state, ids, epoch, assignment, pending revocation, heartbeat timing), which the loop
  publishes after each run by swapping one reference. It never reads or locks the core.
- One network-loop thread per process (`NetworkLoop`, shared by every member) owns every
  group connection and timer, and every `MemberDriver`: it runs each when it is due, feeds
  it responses as they arrive, reaps expired completions, and runs the hooks a member gave
  its `MemberNetwork` (named ``_on_loop_*`` in `GroupMember`; they never block). Its entry
  points assert their thread under pytest. It never waits for a broker: connection setup
  and SASL re-authentication run on short-lived helper threads that hand the socket back.
- The data plane belongs to the application thread, which calls the `Fetcher`'s
  ``confluent_kafka.Consumer`` (librdkafka fetches on its own threads). The loop thread
  touches it only to fence partitions (no lock), to end the application's wait inside
  librdkafka, and to read what an auto-commit commits as the application side published it
  (`Fetcher.publication`, the stored and revoking offsets, the manual assignment: values
  replaced whole, read without a lock). It never takes a data-plane lock (asserted under
  pytest).
"""
