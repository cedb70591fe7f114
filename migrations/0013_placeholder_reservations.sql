-- placeholder_reservations: stands in for the migration of another branch (issue 32) so the
-- numbers run 1..n on this branch; drop this file when the real one is merged.
-- readers: unchanged
SELECT 1;
