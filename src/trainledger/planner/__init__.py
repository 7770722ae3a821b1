"""The planner: search space, candidates and rejections, ranking."""
