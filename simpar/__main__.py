from simpar.cli import run_main

run_main()
