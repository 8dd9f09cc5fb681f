from shapeplan.plan.compiler import ABSENT, Plan, Slot, compile_plan

__all__ = ["ABSENT", "Plan", "Slot", "compile_plan"]
