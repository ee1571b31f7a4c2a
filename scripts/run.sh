#!/usr/bin/env bash
# The main job. Until the node daemon lands this demonstrates the add-path preload library:
# a program started under it sees PATH and LD_LIBRARY_PATH rewritten from TF_* variables.
source "$(dirname "${BASH_SOURCE[0]}")/bootstrap.sh"
uv sync --locked --quiet
tf_add_path="$VGPU_ROOT/.venv/bin/tf-add-path"

echo "libadd_path.so: $("$tf_add_path" path)"
echo "--- a shell started with TF_PREPEND_PATH=/opt/a TF_PATH=/opt/b (LD_BIND_NOW=1):"
LD_BIND_NOW=1 LD_PRELOAD=$("$tf_add_path" path) TF_PREPEND_PATH=/opt/a TF_PATH=/opt/b \
    sh -c 'echo "PATH=$PATH"'
echo "--- tf-add-path exec --prepend PATH=/opt/vgpu/bin --append LD_LIBRARY_PATH=/opt/vgpu/lib:"
"$tf_add_path" exec --prepend PATH=/opt/vgpu/bin --append LD_LIBRARY_PATH=/opt/vgpu/lib -- \
    sh -c 'echo "PATH=$PATH"; echo "LD_LIBRARY_PATH=$LD_LIBRARY_PATH"'
