"""Evaluation reports run on one thread of the learner's own: they take the best model's lock
one at a time, and a pool that grew a thread whenever two met would keep each for good. The
thread starts with the servicer: a report adds none (a soak reads a step as a slope)."""

import asyncio
import threading

from apexrl.learner.servicer import LearnerServicer


class SlowBest:
    """Holds every report until released, as a checkpoint write would."""

    def __init__(self):
        self.release, self.threads = threading.Event(), set()

    def report(self, request):
        self.threads.add(threading.get_ident())
        self.release.wait(10)
        return request


def test_reports_that_meet_share_one_thread():
    best = SlowBest()
    before = threading.active_count()
    servicer = LearnerServicer(None, None, None, best, None)
    started = threading.active_count()

    async def meet():
        reports = [asyncio.create_task(servicer.ReportEvaluation(i, None)) for i in range(4)]
        while not best.threads:  # the first report is running and holds the rest back
            await asyncio.sleep(0.01)
        running = threading.active_count()
        best.release.set()
        answers = await asyncio.gather(*reports)
        return running, answers

    running, answers = asyncio.run(meet())
    assert answers == [0, 1, 2, 3]
    assert started == before + 1 and len(best.threads) == 1 and running == started
