"""A round's draft tree from the drafter's logits: a tensor function of its inputs alone (no
state, no cache, no generator), which is what lets `runtime/compiled.py` compile it per shape;
`TreeStages` is its eager form.
"""

from __future__ import annotations

from torch import Tensor

from dflash_core.speculation.spec import Spec
from dflash_core.speculation.tree import Tree, build_tree, chain_tree


class TreeStages:
    def tree(self, spec: Spec, anchors: Tensor, draft_logits: Tensor | None) -> Tree:
        """anchors [n], draft_logits [n, L, V] (None for plain decoding) -> the verify tree."""
        if spec.method == "none":
            return chain_tree(anchors, anchors[:, None][:, :0])
        if spec.method == "dflash":
            return chain_tree(anchors, draft_logits.argmax(-1))
        return build_tree(anchors, draft_logits, spec.budget, spec.tree_width, spec.tree_depth,
                          spec.spine)


EAGER_STAGES = TreeStages()
