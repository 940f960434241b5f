from gpuboot.cli.main import main

main()
