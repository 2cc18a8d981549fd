"""lhotse manifests (CutSet, or RecordingSet + SupervisionSet per split) as a corpus: see prepare.py."""
