"""Triton role model: hosts one engine for its role (set by the `role` parameter in config.pbtxt).

Thin adapter: the library class turns input tensors into engine requests and results into output tensors
(see lookahead_reasoning.serving.triton_role and lookahead_reasoning.backends.role_tensors).
"""

from lookahead_reasoning.serving.triton_role import RoleModel as TritonPythonModel  # noqa: F401
