"""The model families the recipe trains, exports and serves: one spec each (families/registry.py)."""
