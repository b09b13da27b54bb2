"""A model's answer -> a child source or the reasons it cannot be one (interpret), and
SEARCH/REPLACE patches (patch)."""
