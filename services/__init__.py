"""apexrl: distributed prioritized experience replay (Ape-X) as gRPC microservices."""

import os

# gRPC's fork handlers are for children that go on using gRPC; apexrl's children exec at once
# (local mode's services, a supervisor's restarts, the evaluator's ffmpeg), spawned by fork
# where a preexec_fn is given. With the handlers on, a fork while other threads are in gRPC
# skips them and leaves the parent's poller to epoll_wait on closed descriptors (EBADF): an
# evaluator's ffmpeg died of it as it started, and a soak's supervisor failed a restart with a
# child aborting in ev_epoll1_linux.cc. Set before any module imports grpc; a value already in
# the environment is kept.
os.environ.setdefault("GRPC_ENABLE_FORK_SUPPORT", "false")
