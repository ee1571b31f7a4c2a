from vgpu_limiter.cli import main

main()
