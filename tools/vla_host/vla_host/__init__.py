"""The project's host-side Python shared by the tools (vla_import, vla_libero) and the golden
generators (vla_goldens): the numpy reference pipeline (`reference`), the deterministic npz
writer (`det_npz`), MolmoAct2's prompt tables (`build_prompt_tables`), Fast-WAM's Wan text
rows (`build_umt5_rows`), safetensors tensors as f32 (`safetensors_f32`), the export contract
check (`export_contract`), the QNN context compiler (`qnn_ctx`) and the signed OTA fixtures
the CI harnesses build (`ota_fixtures`)."""
