"""The paper's experiments as named, re-runnable simulator scenarios (`dualpath reproduce`)."""
