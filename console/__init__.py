"""The console: a web page to see, chat with and steer every agent, and the run store behind it."""
