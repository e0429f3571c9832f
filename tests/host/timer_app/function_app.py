"""A Functions app with one timer, every second: tests run it on two hosts to see who fires it."""

import logging

import azure.functions as func

app = func.FunctionApp()


@app.timer_trigger(arg_name="timer", schedule="*/1 * * * * *", run_on_startup=False)
def tick(timer: func.TimerRequest) -> None:
    """Log the occurrence; the host's own log line says when it was due."""
    logging.info("tick past_due=%s", timer.past_due)
