"""What the driver, the judge and the candidate host share: candidates, evaluation records, the wire format."""
