"""One-line error text: tfps errors are single lines meant for a person."""


def one_line(text: object, limit: int = 200) -> str:
  """Joins the meaningful lines of `text` and caps the length.

  TensorFlow's messages start with boilerplate ("Graph execution error:")
  and put the cause on later lines, so all non-empty lines are kept.
  """
  lines = [line.strip() for line in str(text).splitlines()
           if line.strip() and not line.strip().startswith("Graph execution error")]
  summary = " ".join(lines) or "(no message)"
  return summary if len(summary) <= limit else summary[:limit - 3] + "..."
