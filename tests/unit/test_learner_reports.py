"""Evaluation reports run on one thread of the learner's own: they take the best model's lock
one at a time, and a pool that grew a thread whenever two met would keep each for good."""

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
    servicer = LearnerServicer(None, None, None, best, None)

    async def meet():
        reports = [asyncio.create_task(servicer.ReportEvaluation(i, None)) for i in range(4)]
        while not best.threads:  # the first report is running and holds the rest back
            await asyncio.sleep(0.01)
        running = threading.active_count()
        best.release.set()
        answers = await asyncio.gather(*reports)
        return running, answers

    before = threading.active_count()
    running, answers = asyncio.run(meet())
    assert answers == [0, 1, 2, 3]
    assert len(best.threads) == 1 and running == before + 1
