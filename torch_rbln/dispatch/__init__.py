"""Dispatch: what happens to one aten op on an rbln tensor (docs/eager.md ("Eager execution"))."""
