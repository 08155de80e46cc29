"""Who is in the job and where: cluster spec, readiness, local fake clusters."""
