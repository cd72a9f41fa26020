"""Children spawned by fork (a preexec_fn) while other threads are in gRPC calls: with apexrl
imported first, gRPC's fork handlers stay off and its poller keeps working (services/__init__.py).
With them on, each fork logged 'skipping fork() handlers' and the parent's poller hit closed
descriptors ('epoll_wait error: Bad file descriptor', 'Kick failed')."""

import subprocess
import sys
import textwrap

SCRIPT = textwrap.dedent("""
    import subprocess, threading, time
    from concurrent import futures
    import apexrl  # noqa: F401  (before grpc)
    import grpc

    def slow(request, context):
        time.sleep(0.05)
        return request

    handler = grpc.method_handlers_generic_handler(
        "t", {"echo": grpc.unary_unary_rpc_method_handler(slow)})
    server = grpc.server(futures.ThreadPoolExecutor(8), handlers=[handler])
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    echo = grpc.insecure_channel(f"127.0.0.1:{port}").unary_unary("/t/echo")
    stop, answers = threading.Event(), []

    def call():
        while not stop.is_set():
            answers.append(echo(b"x", timeout=10))

    threads = [threading.Thread(target=call) for _ in range(4)]
    for thread in threads:
        thread.start()
    for _ in range(50):
        subprocess.run(["true"], close_fds=True, preexec_fn=lambda: None, check=True)
    stop.set()
    for thread in threads:
        thread.join()
    assert answers and all(a == b"x" for a in answers)
    server.stop(None)
    print("answers", len(answers))
""")


def test_forked_children_leave_grpc_working_and_quiet():
    env = {"PATH": "/usr/bin:/bin"}  # no GRPC_ENABLE_FORK_SUPPORT of the caller's
    result = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True,
                            timeout=120, env=env)  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    assert "answers" in result.stdout
    for symptom in ("fork() handlers", "Bad file descriptor", "Kick failed"):
        assert symptom not in result.stderr, result.stderr[-3000:]
