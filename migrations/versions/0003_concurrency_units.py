"""Concurrency and units: a plan's bound on requests in flight, and what each of its
resources counts.

Revision ID: 0003_concurrency_units
Revises: 0002_tenants
Create Date: 2026-12-01 15:00:00

Existing rows keep their meaning: every plan starts without a concurrency bound and
every resource counts requests (NULL). Batch mode, so that SQLite (which cannot add a
constraint in place) rebuilds the tables with their rows.
"""
from alembic import op
import sqlalchemy as sa


revision = '0003_concurrency_units'
down_revision = '0002_tenants'
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table('quota_plans', schema=None) as batch_op:
        batch_op.add_column(sa.Column('concurrent', sa.Integer(), nullable=True))
        batch_op.create_check_constraint(
            batch_op.f('ck_quota_plans_concurrent'), 'concurrent >= 1'
        )

    with op.batch_alter_table('quota_plan_limits', schema=None) as batch_op:
        batch_op.add_column(sa.Column('unit', sa.String(length=32), nullable=True))
        batch_op.create_check_constraint(
            batch_op.f('ck_quota_plan_limits_unit'), "unit IS NULL OR tier = 'endpoint'"
        )


def downgrade() -> None:
    with op.batch_alter_table('quota_plan_limits', schema=None) as batch_op:
        batch_op.drop_constraint(batch_op.f('ck_quota_plan_limits_unit'), type_='check')
        batch_op.drop_column('unit')

    with op.batch_alter_table('quota_plans', schema=None) as batch_op:
        batch_op.drop_constraint(batch_op.f('ck_quota_plans_concurrent'), type_='check')
        batch_op.drop_column('concurrent')
