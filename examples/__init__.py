"""Sample data shipped with the package: the conversations `ibex demo` imports."""
