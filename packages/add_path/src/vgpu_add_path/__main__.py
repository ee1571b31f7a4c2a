from vgpu_add_path.cli import main

main()
