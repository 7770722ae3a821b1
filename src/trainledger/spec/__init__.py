"""Pure input types: the one job declaration's parts (recipe, layout, cluster, runtime, model, plan)."""
