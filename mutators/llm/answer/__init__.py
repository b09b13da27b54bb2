"""A model's answer -> a child source or the reasons it cannot be one (interpret), the codes
of those reasons (reasons), and SEARCH/REPLACE patches (patch)."""
