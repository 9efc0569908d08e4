"""What several task kinds' stages share: the segment stage, the augment stage of kinds that keep
their rows as they are, splitting, normalising, the data checks, reports and the champion rule's
settings."""
