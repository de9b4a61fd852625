"""The leftovers room: what a killed command made in the project but terraform never recorded
(``unrecorded.py``), found by the cluster's labels and names and removed, for `up` before it applies and
for `down` around its destroy; and `down`'s proof that nothing of the cluster is left (``proof.py``). It
may import every other room (it asks Compute, IAM and Cloud Storage through cloud/ and access/, and books
an unrecorded VM's time through spend/); only backend.py imports it."""

from tfcluster.backends.gcp.leftovers.proof import prove_gone
from tfcluster.backends.gcp.leftovers.unrecorded import remove_after_destroy, remove_before_destroy, remove_unrecorded

__all__ = ["prove_gone", "remove_after_destroy", "remove_before_destroy", "remove_unrecorded"]
