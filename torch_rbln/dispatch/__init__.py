"""Dispatch: what happens to one aten op on an rbln tensor (README "Eager execution")."""
