"""vla-import: a published QNN release (MolmoAct2, Fast-WAM's open-loop one, or a Fast-WAM
release with the world-model contexts) and its checkpoint -> a vlad bundle.

One module per concern: `sources` (local directory or Hub repo id), `release` (the context
binaries through `vlad inspect --json`, the golden npz files, trace.json, onnx/), `checkpoint`
(a MolmoAct2 checkpoint: config.json, processor_config.json, the embedding table from
safetensors, norm_stats.json), `lerobot` (a LeRobot-layout MolmoAct2 checkpoint: the policy
config and the statistics in its processor pipelines), `contract` (the tensors each MolmoAct2
component must have, the bundle settings they imply, the settings vlad cannot express),
`prompt` (the prompt tables, proved against the release's own llm_split0 golden), `fastwam`
(the Fast-WAM release's action_step on its golden world model, the dataset statistics and
upstream's LIBERO settings), `fastwam_chain` (a release with the world-model contexts: the
chain's contract, the text rows from Wan's encoder and the proprio Linear, proved against the
release's goldens), `torch_zip` (tensors out of a `torch.save` checkpoint without torch or
running its pickle), `bundle` (assembling and writing it: built in a temporary
directory, renamed at the end, so a refused import leaves nothing behind). Every refusal is
one `ImportRefused` line naming the file, the key and what was expected and found.
"""
