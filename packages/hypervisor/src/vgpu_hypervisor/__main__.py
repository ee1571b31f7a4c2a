from vgpu_hypervisor.cli import main

main()
