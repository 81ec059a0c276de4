"""One run's lifecycle: its configuration read once, the engine built, the workload replayed on
whichever backend serves it, the records written and the summary built (`run.run`)."""
