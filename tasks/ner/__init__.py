"""Named-entity recognition (`task: ner`): the stages that differ from classification, one module per stage
with the same `build`, `LIBRARIES` and `FILES` as the classification stage it stands for. The stages that do
not differ (segment) are shared; the config sections are the same."""
