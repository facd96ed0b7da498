"""vla-import: a published MolmoAct2 QNN release and its checkpoint -> a vlad bundle.

One module per concern: `sources` (local directory or Hub repo id), `release` (the context
binaries through `vlad inspect --json`, the golden npz files, trace.json, onnx/), `checkpoint`
(config.json, processor_config.json, the embedding table from safetensors, norm_stats.json),
`contract` (the tensors each component must have, and the bundle settings they imply),
`prompt` (the prompt tables, proved against the release's own llm_split0 golden), `bundle`
(assembling and writing it: built in a temporary directory, renamed at the end, so a refused
import leaves nothing behind). Every refusal is one `ImportRefused` line naming the file, the
key and what was expected and found.
"""
