"""Population-based training (`apexrl pbt`): a population of local-mode runs, the worst of
which go on, at each interval, from the best's newest checkpoint with perturbed settings.

- controller.py: the decisions (exploit and explore), pure functions of scores and settings;
- settings.py: the population's settings and each member's initial ones;
- members.py: a member (a local-mode run) and the atomic copy of a winner's checkpoint;
- run.py: `apexrl pbt` itself: members, intervals, lineage, the solved line.
"""
