"""The trusted service that runs `execute_python_script` requests in throw-away sandboxes."""
