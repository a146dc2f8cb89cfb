from rllava.commands.memory import main

main()
